package arch

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snapshotDeletes are the calls that delete a snapshot's record or its
// files, each with the only files allowed to make it. Deletion is the one
// operation that can lose user state, so the control plane decides it in
// one place: internal/workflow/snapshots.go, whose referencesOf every
// deletion path asks (docs/architecture.md). A new path calls into that
// file instead of deleting itself.
var snapshotDeletes = []struct {
	call    *regexp.Regexp
	allowed []string
	why     string
}{
	{regexp.MustCompile(`\.Snapshots\(\)\.Delete\(`), []string{"internal/workflow/snapshots.go"},
		"snapshot records are deleted by the snapshot lifecycle (internal/workflow/snapshots.go), after referencesOf"},
	// nodecalls.go is the engine's boundary over node agents: it forwards
	// the call snapshots.go makes.
	{regexp.MustCompile(`\bobjects\.DeleteSnapshot\(|\.DropCheckpoint\(ctx`), []string{"internal/workflow/snapshots.go", "internal/workflow/nodecalls.go"},
		"snapshot files are removed by the snapshot lifecycle (internal/workflow/snapshots.go), after referencesOf"},
	// The engine's Objects is the server's adapter over snapshot storage;
	// a node removes its own local copies and its own unrecorded uploads,
	// when the control plane lets go of them.
	{regexp.MustCompile(`\bsnapshot\.DeleteSnapshot\(`), []string{"internal/server/server.go", "internal/node/"},
		"only the engine's Objects adapter (internal/server/server.go) and a node's own local copies delete snapshot objects"},
	{regexp.MustCompile(`\bsnapshot\.SweepOrphans\(`), []string{"internal/server/server.go"},
		"the orphan sweep runs in the server, asking the engine's LocationReferenced"},
}

func TestSnapshotDeletionHasOneHome(t *testing.T) {
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Ext(path) != ".go" || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for _, d := range snapshotDeletes {
			if d.call.Match(data) && !allowedIn(rel, d.allowed) {
				t.Errorf("%s calls %s: %s", rel, d.call, d.why)
			}
		}
		if rel == "internal/server/server.go" {
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, "snapshot.SweepOrphans(") && !strings.Contains(line, "engine.LocationReferenced") {
					t.Errorf("%s: the orphan sweep must ask the engine's LocationReferenced: %s", rel, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked %d Go files: the walk missed the repository", checked)
	}
}

func allowedIn(rel string, allowed []string) bool {
	for _, a := range allowed {
		if rel == a || strings.HasSuffix(a, "/") && strings.HasPrefix(rel, a) {
			return true
		}
	}
	return false
}

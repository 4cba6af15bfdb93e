package e2e

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// cpAs runs `torpor actor cp` with token and returns its combined output
// and error.
func (c *cluster) cpAs(token string, args ...string) (string, error) {
	c.t.Helper()
	out, err := c.torporAs(token, append([]string{"actor", "cp"}, args...)...).CombinedOutput()
	return string(out), err
}

// TestCopyFilesBothWays: `torpor actor cp` of a directory holding a
// 10 MB file into a suspended actor's volume and back is byte-identical;
// a file written into its root filesystem (kept in the sandbox's memory)
// comes back after a suspend; a path climbing out with ".." and a token
// of another space are refused.
func TestCopyFilesBothWays(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	c.applyTemplate(counterTemplate(t, "counter", nil))
	c.createActor("c1", "counter")
	token := c.apiToken("default")

	work := t.TempDir()
	src := filepath.Join(work, "src")
	big := make([]byte, 10<<20)
	rand.Read(big)
	files := map[string][]byte{"big.bin": big, "sub/small.txt": []byte("small\n"), "empty": nil}
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := c.cpAs(token, src, "c1:/data/dir"); err != nil {
		t.Fatalf("cp %s c1:/data/dir: %v\n%s", src, err, out)
	}
	if got := c.actor("c1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("after cp into the suspended actor it is %s, want RUNNING", got)
	}
	c.suspend("c1")
	back := filepath.Join(work, "back")
	if out, err := c.cpAs(token, "c1:/data/dir", back); err != nil {
		t.Fatalf("cp c1:/data/dir %s: %v\n%s", back, err, out)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(back, name))
		if err != nil {
			t.Fatalf("copied back: %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s came back with %d bytes, not the %d sent (or other bytes)", name, len(got), len(want))
		}
		if fi, _ := os.Stat(filepath.Join(back, name)); fi.Mode().Perm() != 0o640 {
			t.Errorf("%s came back with mode %v, want 0640", name, fi.Mode().Perm())
		}
	}

	// The root filesystem's writes live in the sandbox's memory: they
	// are reached from inside, and kept by the suspend's snapshot.
	note := filepath.Join(work, "note.txt")
	if err := os.WriteFile(note, []byte("in the overlay\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.cpAs(token, note, "c1:/tmp"); err != nil {
		t.Fatalf("cp %s c1:/tmp: %v\n%s", note, err, out)
	}
	c.suspend("c1")
	if out, err := c.cpAs(token, "c1:/tmp/note.txt", "-"); err != nil || out != "in the overlay\n" {
		t.Fatalf("cp c1:/tmp/note.txt - after a suspend: %q, %v", out, err)
	}

	for _, args := range [][]string{
		{"c1:/data/../../etc/passwd", filepath.Join(work, "passwd")},
		{note, "c1:/data/../escape.txt"},
	} {
		out, err := c.cpAs(token, args...)
		if err == nil || !strings.Contains(out, `".." segment`) || !strings.Contains(out, "/data/..") {
			t.Errorf("cp %s: %v\n%s\nwant a refusal naming the path", strings.Join(args, " "), err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(work, "passwd")); err == nil {
		t.Error("the refused copy wrote a file")
	}
	out, err := c.cpAs(c.apiToken("other"), "c1:/data/dir", filepath.Join(work, "other"))
	if err == nil || !strings.Contains(out, `no access to space "default"`) {
		t.Errorf("cp with a token of another space: %v\n%s\nwant PermissionDenied", err, out)
	}
}

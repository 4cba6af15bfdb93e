package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/server"
)

// TestForkCommandsAgainstRealServer: the fork, revert and tag commands
// reach the engine and show its refusals, each naming what is wrong (the
// engine's decisions themselves: workflow's tests; on gVisor: e2e).
func TestForkCommandsAgainstRealServer(t *testing.T) {
	isolate(t)
	_, url := realServer(t, server.Options{})
	dir, _ := imageDir(t)
	file := filepath.Join(dir, "counter.yaml")
	if err := os.WriteFile(file, []byte(goodTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, url, "template", "apply", "-f", file)
	ok(t, url, "actor", "create", "c1", "--template", "counter")

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"actor", "create", "f1"}, "give --template, or --from or --from-tag to fork"},
		{[]string{"actor", "create", "f1", "--from", "c1", "--from-tag", "t"}, "none of the others can be"},
		{[]string{"actor", "create", "f1", "--from", "c1"}, "failed_precondition: source actor default/c1 has no snapshot to fork"},
		{[]string{"actor", "create", "f1", "--from", "c9"}, "not_found: source actor default/c9 does not exist"},
		{[]string{"actor", "create", "f1", "--from-tag", "other/t1", "--template", "counter"}, "not_found: tag other/t1 does not exist"},
		{[]string{"actor", "revert", "c1", "--yes"}, "failed_precondition: actor default/c1 has no snapshot in snapshot storage to revert to"},
		{[]string{"snapshot", "tag", "s-missing", "t1"}, "not_found"},
		{[]string{"snapshot", "untag", "t1"}, "not_found"},
	} {
		if msg := fails(t, url, tt.args...); !strings.Contains(msg, tt.want) {
			t.Errorf("torpor %s: %q, want it to say %q", strings.Join(tt.args, " "), msg, tt.want)
		}
	}
	r := torporWithInput(t, url, "n\n", "actor", "revert", "c1", "--to", "s-1")
	if r.code != 1 || !strings.Contains(r.stderr, "Revert actor default/c1 to snapshot s-1, discarding its newer state? [y/N]") || !strings.Contains(r.stderr, "not reverted") {
		t.Errorf("revert answered no: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := torpor(t, url, "snapshot", "tags"); r.code != 0 || !strings.Contains(r.stderr, "No tags found") {
		t.Errorf("snapshot tags with none: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

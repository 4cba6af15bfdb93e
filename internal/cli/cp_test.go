package cli

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
)

func TestActorPath(t *testing.T) {
	for _, tc := range []struct {
		arg, actor, path string
		remote           bool
	}{
		{"c1:/data/dir", "c1", "/data/dir", true},
		{"c1:", "c1", "", true},
		{"./dir", "", "./dir", false},
		{"/abs/a:b", "", "/abs/a:b", false},
		{"dir/with:colon", "", "dir/with:colon", false},
		{":/x", "", ":/x", false},
	} {
		actor, p, remote := actorPath(tc.arg)
		if actor != tc.actor || p != tc.path || remote != tc.remote {
			t.Errorf("actorPath(%q) = %q, %q, %v; want %q, %q, %v", tc.arg, actor, p, remote, tc.actor, tc.path, tc.remote)
		}
	}
}

func TestParsePortPair(t *testing.T) {
	for _, tc := range []struct {
		arg           string
		local, remote int
		ok            bool
	}{
		{"6379", 6379, 6379, true},
		{"16379:6379", 16379, 6379, true},
		{"0:6379", 0, 6379, true},
		{"6379:0", 0, 0, false},
		{"x", 0, 0, false},
		{"1:70000", 0, 0, false},
	} {
		local, remote, err := parsePortPair(tc.arg)
		if (err == nil) != tc.ok || (tc.ok && (local != tc.local || remote != tc.remote)) {
			t.Errorf("parsePortPair(%q) = %d, %d, %v", tc.arg, local, remote, err)
		}
	}
}

// TestRenameTop: a download's archive lands under the destination's
// name; an entry outside the source's is an error.
func TestRenameTop(t *testing.T) {
	archive := func(names ...string) io.Reader {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, n := range names {
			tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: 0o755})
		}
		tw.Close()
		return &buf
	}
	tr := tar.NewReader(renameTop(archive("dir/", "dir/sub/", "dir/sub/f"), "dir", "back"))
	var got []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name)
	}
	if want := []string{"back", "back/sub", "back/sub/f"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("renamed %q, want %q", got, want)
	}
	if _, err := io.ReadAll(renameTop(archive("dir/", "other/x"), "dir", "back")); err == nil {
		t.Error("an entry outside the source was renamed")
	}
	if _, err := io.ReadAll(renameTop(archive("dirx/y"), "dir", "back")); err == nil {
		t.Error("an entry of a sibling with the same prefix was renamed")
	}
}

package guestfs

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runOp runs the helper as the node does and returns its exit status,
// output and message.
func runOp(t *testing.T, stdin []byte, args ...string) (int, []byte, string) {
	t.Helper()
	var out, msg bytes.Buffer
	code := Main(args, bytes.NewReader(stdin), &out, &msg)
	return code, out.Bytes(), msg.String()
}

func TestWriteReadStatList(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.txt")
	if code, _, msg := runOp(t, []byte("hello"), OpWrite, p, "600"); code != ExitOK {
		t.Fatalf("write: %d %s", code, msg)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("written file: %v %v, want mode 0600", fi, err)
	}
	if code, out, msg := runOp(t, nil, OpRead, p); code != ExitOK || string(out) != "hello" {
		t.Fatalf("read: %d %q %s", code, out, msg)
	}
	code, out, msg := runOp(t, nil, OpStat, p)
	var info Info
	if code != ExitOK || json.Unmarshal(out, &info) != nil || info.Size != 5 || info.IsDir {
		t.Fatalf("stat: %d %s %s", code, out, msg)
	}
	code, out, msg = runOp(t, nil, OpList, dir)
	var infos []Info
	if code != ExitOK || json.Unmarshal(out, &infos) != nil || len(infos) != 1 || infos[0].Name != "f.txt" {
		t.Fatalf("list: %d %s %s", code, out, msg)
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{OpRead, dir}, ExitPrecondition},
		{[]string{OpList, p}, ExitPrecondition},
		{[]string{OpRead, filepath.Join(dir, "missing")}, ExitNotFound},
		{[]string{OpRead, dir + "/../f.txt"}, ExitInvalid},
		{[]string{OpRead, "relative"}, ExitInvalid},
	} {
		if code, _, msg := runOp(t, nil, tc.args...); code != tc.code || msg == "" {
			t.Errorf("%v: exit %d (%s), want %d with a message", tc.args, code, msg, tc.code)
		}
	}
}

// TestTarRoundTripAndConfinement: a directory archived and extracted
// elsewhere is the same; an archive entry climbing out of the target
// directory, or going through a symlink that leads out, is refused and
// writes nothing outside.
func TestTarRoundTripAndConfinement(t *testing.T) {
	src := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "sub", "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, archive, msg := runOp(t, nil, OpTar, src)
	if code != ExitOK {
		t.Fatalf("tar: %d %s", code, msg)
	}
	dst := t.TempDir()
	if code, _, msg := runOp(t, archive, OpUntar, dst); code != ExitOK {
		t.Fatalf("untar: %d %s", code, msg)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "tree", "sub", "a")); err != nil || string(b) != "a" {
		t.Fatalf("extracted: %q %v", b, err)
	}

	outside := t.TempDir()
	for name, entries := range map[string][]tar.Header{
		"dot-dot": {{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"symlink out": {
			{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside, Mode: 0o777},
			{Name: "link/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
		}
		tw.Close()
		target := filepath.Join(t.TempDir(), "in")
		code, _, msg := runOp(t, buf.Bytes(), OpUntar, target)
		if code == ExitOK {
			t.Errorf("%s: extracted", name)
		}
		if !strings.Contains(msg, target) {
			t.Errorf("%s: message %q does not name %s", name, msg, target)
		}
		if _, err := os.Stat(filepath.Join(outside, "escaped")); err == nil {
			t.Fatalf("%s: wrote outside the target directory", name)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(target), "escaped")); err == nil {
			t.Fatalf("%s: wrote beside the target directory", name)
		}
	}
}

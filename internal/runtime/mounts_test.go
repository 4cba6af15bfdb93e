package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestMountsUnder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root (CI runs as root)")
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "m")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", target, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(target, 0)
	got, err := MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{target}) {
		t.Fatalf("mounts under %s: %q, want %q", dir, got, target)
	}
	if got, _ := MountsUnder(target); len(got) != 0 {
		t.Fatalf("mounts under %s: %q, want none (the mount point itself is not below it)", target, got)
	}
}

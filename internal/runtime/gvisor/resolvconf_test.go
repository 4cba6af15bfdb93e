package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestRestoreAfterTheNodeWroteResolvConf: a FULL checkpoint of a workload
// whose image had no /etc/resolv.conf (none at all, or no /etc), taken
// after the guest looked for it, restores once the node has written one
// into the image's unpacked tree, as a node does since it runs the
// workloads' resolver (internal/node's ensureResolvConf): the shared
// root filesystem a checkpoint was taken on gains a file and maybe a
// directory before its restore.
func TestRestoreAfterTheNodeWroteResolvConf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		hasEtc bool
	}{
		{"no-etc", false},
		{"etc", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			a, b := h.slots[0], h.slots[1]
			etc := filepath.Join(h.rootfs, "etc")
			if tc.hasEtc {
				if err := os.MkdirAll(etc, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(etc, "hostname"), []byte("image\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			w := h.workload(t)
			if err := h.rt.Run(ctx, a, w); err != nil {
				t.Fatal(err)
			}
			waitReady(t, a.IP)
			request(t, a.IP)
			// The guest looked and found none: a lookup the sandbox may
			// have cached.
			if err := h.rt.Exec(ctx, a, "main", []string{"/bin/counter", "exists", "/etc/resolv.conf"}); err == nil {
				t.Fatal("/etc/resolv.conf exists in the guest before the node wrote one")
			}
			img := filepath.Join(t.TempDir(), "image")
			if err := h.rt.Checkpoint(ctx, a, img, false); err != nil {
				t.Fatal(err)
			}
			if err := h.rt.Terminate(ctx, a); err != nil {
				t.Fatal(err)
			}

			// What ensureResolvConf does to the unpacked image.
			if err := os.MkdirAll(etc, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 10.0.0.1\n"), 0o644); err != nil {
				t.Fatal(err)
			}

			if err := h.rt.Restore(ctx, b, w, img); err != nil {
				t.Fatalf("restore after the node wrote /etc/resolv.conf: %v", err)
			}
			waitReady(t, b.IP)
			if got, want := request(t, b.IP), "count=2 volume=2 rootfs=2 greeting=hello"; got != want {
				t.Fatalf("after restore: %q, want %q", got, want)
			}
			// And the restored guest resolves through the node: what it
			// found missing before is read again, not remembered.
			if err := h.rt.Exec(ctx, b, "main", []string{"/bin/counter", "exists", "/etc/resolv.conf"}); err != nil {
				t.Errorf("after the restore the guest has no /etc/resolv.conf: %v", err)
			}
		})
	}
}

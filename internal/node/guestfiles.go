package node

// Files of a running workload. A sandbox keeps its root filesystem's writes
// in its own memory, out of the host's sight, so the node reaches files
// from inside: it runs its own binary there (`torpor guest-files`, see
// internal/guestfs) with the runtime's exec, as the container's process
// runs, and relays its standard streams. The binary enters the sandbox
// through the identity directory every sandbox mounts already (a hard link
// named guestHelperName), so no sandbox needs a mount of its own for it and
// images checkpointed before it existed still restore.

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/guestfs"
)

// guestHelperName is the helper's name in a workload's identity
// directory.
const guestHelperName = ".torpor-guest"

// fileChunk is the size of the chunks a read streams.
const fileChunk = 256 << 10

// guestHelper is the node's copy of the helper binary, beside the
// identity directories (so it can be hard-linked into them).
type guestHelper struct {
	// source is the binary to copy: a statically linked torpor (default
	// the node's own executable).
	source string
	// dir is where the copy goes: the identity directories' root.
	dir string

	once sync.Once
	path string
	err  error
}

// install copies the helper into place once; it fails for a binary that
// cannot run in a sandbox (linked dynamically: the image has no loader
// or libraries of the host's).
func (g *guestHelper) install() (string, error) {
	g.once.Do(func() {
		src := g.source
		if src == "" {
			if src, g.err = os.Executable(); g.err != nil {
				g.err = fmt.Errorf("the node's executable: %w", g.err)
				return
			}
		}
		if g.err = checkStatic(src); g.err != nil {
			return
		}
		if g.err = os.MkdirAll(g.dir, 0o755); g.err != nil {
			return
		}
		g.path = filepath.Join(g.dir, guestHelperName)
		tmp := g.path + ".tmp"
		if g.err = copyFile(src, tmp, 0o755); g.err != nil {
			return
		}
		if g.err = os.Rename(tmp, g.path); g.err != nil {
			os.Remove(tmp)
		}
	})
	return g.path, g.err
}

// place links the helper into s's identity directory (identityDir),
// which every start empties, and returns its path in the guest.
func (g *guestHelper) place(s *slot, identityDir string) (string, error) {
	src, err := g.install()
	if err != nil {
		return "", err
	}
	dst := filepath.Join(identityDir, guestHelperName)
	if _, err := os.Lstat(dst); err == nil {
		return IdentityMountPath + "/" + guestHelperName, nil
	}
	if err := os.Link(src, dst); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("worker %s: place the guest helper: %w", s.name(), err)
	}
	return IdentityMountPath + "/" + guestHelperName, nil
}

// checkStatic refuses a binary that needs a program interpreter (the
// dynamic loader).
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("guest helper %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "guest helper %s is linked dynamically and cannot run in a sandbox: build torpor with CGO_ENABLED=0 (make build) or point the node at such a binary (node.Config.GuestHelper)", path)
		}
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// limitedBuffer keeps the first 4 KiB written to it: the helper's
// message.
type limitedBuffer struct{ b *bytes.Buffer }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := 4096 - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func fileInfo(i guestfs.Info) *torporv1.FileInfo {
	return &torporv1.FileInfo{
		Name: i.Name, Size: i.Size, Mode: i.Mode, ModifyTime: timestamppb.New(i.ModTime), IsDir: i.IsDir, LinkTarget: i.LinkTarget,
	}
}

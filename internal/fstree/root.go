// Package fstree reads and writes file trees confined to a root directory:
// image layers, durable-volume archives and restored snapshots. Every
// operation goes through an os.Root, so no name, symlink or hard link an
// untrusted tree carries can reach a file outside it, even if the tree
// changes underneath.
package fstree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MaxLinkHops bounds symlink resolution, as the kernel's ELOOP does.
const MaxLinkHops = 255

// Root is a directory that names are resolved in and writes confined to.
type Root struct {
	*os.Root
	// asRoot: ownership is kept only when running as root; an unprivileged
	// process keeps its own.
	asRoot bool
}

// Open opens the directory dir as a Root.
func Open(dir string) (*Root, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &Root{Root: r, asRoot: os.Geteuid() == 0}, nil
}

// Attrs is the metadata SetAttrs gives a file.
type Attrs struct {
	// Mode holds the permission, set-id and sticky bits, as stat(2) has
	// them (07777).
	Mode       uint32
	UID, GID   int
	AccessTime time.Time
	ModTime    time.Time
}

// SetAttrs gives name (not a symlink's target) the owner, mode and times of
// a. A symlink has no mode of its own; a zero AccessTime is taken as
// ModTime.
func (r *Root) SetAttrs(name string, a Attrs) error {
	fi, err := r.Lstat(name)
	if err != nil {
		return err
	}
	// chown clears set-id bits, so the mode goes after it.
	if r.asRoot {
		if err := r.Lchown(name, a.UID, a.GID); err != nil {
			return err
		}
	}
	atime := a.AccessTime
	if atime.IsZero() {
		atime = a.ModTime
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return r.lchtimes(name, atime, a.ModTime)
	}
	if err := r.Chmod(name, fileMode(a.Mode)); err != nil {
		return err
	}
	return r.Chtimes(name, atime, a.ModTime)
}

// lchtimes sets the times of the symlink name itself, which os.Root's
// Chtimes would follow.
func (r *Root) lchtimes(name string, atime, mtime time.Time) error {
	dir, base := path.Split(name)
	return r.inDir(dir, func(fd int) error {
		ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
		if err := unix.UtimesNanoAt(fd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &fs.PathError{Op: "utimes", Path: name, Err: err}
		}
		return nil
	})
}

// mkfifo makes a named pipe at name.
func (r *Root) mkfifo(name string, mode uint32) error {
	dir, base := path.Split(name)
	return r.inDir(dir, func(fd int) error {
		if err := unix.Mkfifoat(fd, base, mode); err != nil {
			return &fs.PathError{Op: "mkfifo", Path: name, Err: err}
		}
		return nil
	})
}

// inDir calls fn with a descriptor of the directory dir, opened inside the
// root, for the calls os.Root does not offer.
func (r *Root) inDir(dir string, fn func(fd int) error) error {
	if dir = strings.TrimSuffix(dir, "/"); dir == "" {
		dir = "."
	}
	d, err := r.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	sc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := sc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// fileMode turns stat(2) permission bits into an fs.FileMode.
func fileMode(bits uint32) fs.FileMode {
	m := fs.FileMode(bits & 0o777)
	if bits&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if bits&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if bits&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// ErrThroughSymlink is returned for a name that reaches a file through a
// symlink where the tree's rules allow none.
var ErrThroughSymlink = errors.New("path goes through a symlink")

// Resolve returns rel (slash-separated, inside the root) with every symlink
// on its way followed as if the root were "/": "..", and absolute targets,
// never climb above it. The result ("." for the root) names no symlink;
// components that do not exist yet resolve as plain names. It is how a
// guest whose root filesystem this is reads the path.
func (r *Root) Resolve(rel string) (string, error) {
	return r.resolve(rel, true)
}

// resolve is Resolve, or, without follow, a check that no component of rel
// is a symlink (ErrThroughSymlink).
func (r *Root) resolve(rel string, follow bool) (string, error) {
	resolved := "" // holds no symlinks
	pending := strings.Split(rel, "/")
	hops := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if resolved = path.Dir(resolved); resolved == "." {
				resolved = ""
			}
			continue
		}
		next := path.Join(resolved, c)
		fi, err := r.Lstat(next)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.Mode()&fs.ModeSymlink == 0) {
			resolved = next
			continue
		}
		if err != nil {
			return "", err
		}
		if !follow {
			return "", ErrThroughSymlink
		}
		if hops++; hops > MaxLinkHops {
			return "", fmt.Errorf("%q: too many levels of symbolic links", rel)
		}
		target, err := r.Readlink(next)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			resolved = ""
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	if resolved == "" {
		return ".", nil
	}
	return resolved, nil
}

package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

const (
	whiteoutPrefix = ".wh."
	// opaqueWhiteout in a directory hides everything lower layers put there.
	opaqueWhiteout = ".wh..wh..opq"
	// maxLinkHops bounds symlink resolution, as the kernel's ELOOP does.
	maxLinkHops = 255
)

// applyLayer writes one uncompressed layer onto the root filesystem at root,
// applying OCI whiteouts. Every path is resolved inside root with symlinks
// read as the guest would see them (an absolute target starts at root), so
// no entry, link or symlink in the layer can write outside it; an entry
// whose name climbs out of the root is an error.
func applyLayer(ctx context.Context, root string, r io.Reader) error {
	tr := tar.NewReader(r)
	// Paths this layer wrote, which its opaque whiteouts must spare whatever
	// order the entries come in.
	written := map[string]bool{}
	var opaqueDirs []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading layer: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := entryPath(hdr.Name)
		if err != nil {
			return err
		}
		if rel == "" {
			if hdr.Typeflag == tar.TypeDir {
				if err := setAttrs(root, hdr); err != nil {
					return fmt.Errorf("entry %q: %w", hdr.Name, err)
				}
			}
			continue
		}
		dir, base := path.Split(rel)
		switch {
		case base == opaqueWhiteout:
			opaqueDirs = append(opaqueDirs, path.Clean(dir))
			continue
		case strings.HasPrefix(base, whiteoutPrefix):
			parent, err := resolveInRoot(root, dir)
			if err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
			if err := os.RemoveAll(filepath.Join(parent, strings.TrimPrefix(base, whiteoutPrefix))); err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
			continue
		}
		if err := writeEntry(root, dir, base, hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		written[rel] = true
	}
	for _, dir := range opaqueDirs {
		host, err := resolveInRoot(root, dir)
		if err != nil {
			return fmt.Errorf("opaque whiteout in %q: %w", dir, err)
		}
		if err := removeLower(host, dir, written); err != nil {
			return fmt.Errorf("opaque whiteout in %q: %w", dir, err)
		}
	}
	return nil
}

// entryPath turns an entry name into a clean path relative to the root
// ("" for the root itself).
func entryPath(name string) (string, error) {
	p := path.Clean(strings.TrimLeft(name, "/"))
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("entry %q points outside the root filesystem", name)
	}
	if p == "." {
		return "", nil
	}
	return p, nil
}

// resolveInRoot returns the host path of rel inside root, following every
// symlink on the way as if root were "/": "..", and absolute targets, never
// climb above root. Components that do not exist yet resolve as plain names.
func resolveInRoot(root, rel string) (string, error) {
	resolved := "" // relative to root; holds no symlinks
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
		fi, err := os.Lstat(filepath.Join(root, next))
		if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.Mode()&fs.ModeSymlink == 0) {
			resolved = next
			continue
		}
		if err != nil {
			return "", err
		}
		if hops++; hops > maxLinkHops {
			return "", fmt.Errorf("%q: too many levels of symbolic links", rel)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			resolved = ""
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	return filepath.Join(root, filepath.FromSlash(resolved)), nil
}

// writeEntry creates the file, directory or link hdr describes as base in
// the directory dir of the root filesystem, replacing what was there unless
// both are directories.
func writeEntry(root, dir, base string, hdr *tar.Header, content io.Reader) error {
	parent, err := resolveInRoot(root, dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	target := filepath.Join(parent, base)
	if fi, err := os.Lstat(target); err == nil && !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
		if err := os.RemoveAll(target); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case tar.TypeReg:
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, content)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		// Stored as written: it is read in the guest, and resolveInRoot
		// confines it whenever a later entry goes through it.
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return err
		}
		return chownIfRoot(target, hdr)
	case tar.TypeLink:
		linkRel, err := entryPath(hdr.Linkname)
		if err != nil {
			return fmt.Errorf("hard link: %w", err)
		}
		if linkRel == "" {
			return errors.New("hard link to the root directory")
		}
		linkDir, linkBase := path.Split(linkRel)
		linkParent, err := resolveInRoot(root, linkDir)
		if err != nil {
			return err
		}
		// link(2) does not follow a symlink named as its source, so the
		// link cannot reach outside the root through one.
		return os.Link(filepath.Join(linkParent, linkBase), target)
	case tar.TypeFifo:
		if err := unix.Mkfifo(target, 0o600); err != nil {
			return err
		}
	default:
		// Device nodes come from the sandbox's own /dev, never the image.
		slog.Debug("skipping image entry", "name", hdr.Name, "type", string(hdr.Typeflag))
		return nil
	}
	return setAttrs(target, hdr)
}

// setAttrs gives a file or directory the owner, mode and times of its entry.
// Ownership is kept only when running as root; the mode is set after it,
// because chown clears set-id bits.
func setAttrs(p string, hdr *tar.Header) error {
	if err := chownIfRoot(p, hdr); err != nil {
		return err
	}
	mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if hdr.Typeflag == tar.TypeDir && os.Geteuid() != 0 {
		// Without root's override, later entries could not be written into
		// a read-only directory.
		mode |= 0o700
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	return os.Chtimes(p, hdr.AccessTime, hdr.ModTime)
}

// chownIfRoot gives p (not a symlink's target) the entry's owner; only root
// may, and an unprivileged unpack keeps its own.
func chownIfRoot(p string, hdr *tar.Header) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(p, hdr.Uid, hdr.Gid)
}

// removeLower deletes what lower layers left under the directory host (rel
// inside the root), keeping every path this layer wrote.
func removeLower(host, rel string, written map[string]bool) error {
	entries, err := os.ReadDir(host)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		childRel := path.Join(rel, e.Name())
		childHost := filepath.Join(host, e.Name())
		if !written[childRel] {
			if err := os.RemoveAll(childHost); err != nil {
				return err
			}
			continue
		}
		if e.IsDir() {
			if err := removeLower(childHost, childRel, written); err != nil {
				return err
			}
		}
	}
	return nil
}

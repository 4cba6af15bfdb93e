package fstree

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
	"strings"
	"time"
)

const (
	whiteoutPrefix = ".wh."
	// opaqueWhiteout in a directory hides everything lower layers put there.
	opaqueWhiteout = ".wh..wh..opq"
)

// Extract unpacks a data archive into r: directories, regular files and
// symlinks, with their modes, times and (as root) owners. Names must be
// relative, without empty, "." or ".." segments, and may not go through a
// symlink; any other type of entry is an error.
func Extract(ctx context.Context, r *Root, archive io.Reader) error {
	return (&extractor{r: r}).run(ctx, archive)
}

// ApplyLayer writes one uncompressed OCI image layer onto the root
// filesystem r, applying whiteouts. Names and symlinks resolve as the guest
// reads them (Resolve): a symlink is stored as written and followed inside
// the root, and a name that climbs out of it is an error. Hard links and
// named pipes are made; device nodes are skipped, since the sandbox brings
// its own /dev.
func ApplyLayer(ctx context.Context, r *Root, layer io.Reader) error {
	return (&extractor{r: r, layer: true}).run(ctx, layer)
}

// extractor holds the state of one archive's extraction.
type extractor struct {
	r     *Root
	layer bool
	// dirs are the directories made, whose times are set once nothing more
	// is created in them.
	dirs []dirTimes
	// written are the paths this layer wrote, which its opaque whiteouts
	// must spare whatever order the entries come in.
	written map[string]bool
	opaque  []string
}

type dirTimes struct {
	name         string
	atime, mtime time.Time
}

func (x *extractor) run(ctx context.Context, archive io.Reader) error {
	x.written = map[string]bool{}
	tr := tar.NewReader(archive)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	for _, dir := range x.opaque {
		if err := x.removeLower(dir); err != nil {
			return fmt.Errorf("opaque whiteout in %q: %w", dir, err)
		}
	}
	// Deepest first: setting a directory's times is the last change in it.
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		fi, err := x.r.Lstat(d.name)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.IsDir()) {
			continue // a later entry of the archive replaced it
		}
		if err == nil {
			err = x.r.Chtimes(d.name, d.atime, d.mtime)
		}
		if err != nil {
			return fmt.Errorf("directory %q: %w", d.name, err)
		}
	}
	return nil
}

// entry applies one entry of the archive.
func (x *extractor) entry(hdr *tar.Header, content io.Reader) error {
	rel, err := x.name(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		if hdr.Typeflag == tar.TypeDir {
			return x.setAttrs(rel, hdr)
		}
		return nil
	}
	dir, base := path.Split(rel)
	if x.layer {
		switch {
		case base == opaqueWhiteout:
			x.opaque = append(x.opaque, path.Clean(dir))
			return nil
		case strings.HasPrefix(base, whiteoutPrefix):
			return x.whiteout(dir, strings.TrimPrefix(base, whiteoutPrefix))
		}
	}
	if err := x.write(dir, base, hdr, content); err != nil {
		return err
	}
	if x.layer {
		x.written[rel] = true
	}
	return nil
}

// name checks an entry name and returns it as a clean path relative to the
// root ("." for the root itself, which only a layer may name).
func (x *extractor) name(name string) (string, error) {
	if x.layer {
		p := path.Clean(strings.TrimLeft(name, "/"))
		if p == ".." || strings.HasPrefix(p, "../") {
			return "", errors.New("points outside the root filesystem")
		}
		return p, nil
	}
	clean := strings.TrimSuffix(name, "/")
	if clean == "" || strings.HasPrefix(clean, "/") {
		return "", errors.New("not a relative path")
	}
	for _, seg := range strings.Split(clean, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("bad path segment %q", seg)
		}
	}
	return clean, nil
}

// whiteout removes what lower layers put at name in dir.
func (x *extractor) whiteout(dir, name string) error {
	if name == "" || name == "." || name == ".." {
		return errors.New("whiteout of no file")
	}
	parent, err := x.r.resolve(dir, true)
	if err != nil {
		return err
	}
	return x.r.RemoveAll(path.Join(parent, name))
}

// write creates the file, directory or link hdr describes as base in the
// directory dir, replacing what was there unless both are directories.
func (x *extractor) write(dir, base string, hdr *tar.Header, content io.Reader) error {
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
	case tar.TypeLink, tar.TypeFifo:
		if !x.layer {
			return fmt.Errorf("unsupported type %q", hdr.Typeflag)
		}
	default:
		if !x.layer {
			return fmt.Errorf("unsupported type %q", hdr.Typeflag)
		}
		slog.Debug("skipping image entry", "name", hdr.Name, "type", string(hdr.Typeflag))
		return nil
	}
	parent, err := x.r.resolve(dir, x.layer)
	if err != nil {
		return err
	}
	if err := x.r.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	target := path.Join(parent, base)
	if fi, err := x.r.Lstat(target); err == nil && !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
		if err := x.r.RemoveAll(target); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := x.r.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		x.dirs = append(x.dirs, dirTimes{target, hdr.AccessTime, hdr.ModTime})
	case tar.TypeReg:
		if err := x.writeFile(target, content); err != nil {
			return err
		}
	case tar.TypeSymlink:
		// Stored as written: it is read in the guest, and resolve confines
		// it whenever a later entry goes through it.
		if err := x.r.Symlink(hdr.Linkname, target); err != nil {
			return err
		}
	case tar.TypeLink:
		return x.link(target, hdr.Linkname)
	case tar.TypeFifo:
		if err := x.r.mkfifo(target, 0o600); err != nil {
			return err
		}
	}
	return x.setAttrs(target, hdr)
}

func (x *extractor) writeFile(name string, content io.Reader) error {
	f, err := x.r.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// link makes target a hard link of the layer's file linkname.
func (x *extractor) link(target, linkname string) error {
	rel, err := x.name(linkname)
	if err != nil {
		return fmt.Errorf("hard link %q: %w", linkname, err)
	}
	if rel == "." {
		return errors.New("hard link to the root directory")
	}
	dir, base := path.Split(rel)
	parent, err := x.r.resolve(dir, true)
	if err != nil {
		return err
	}
	// link(2) does not follow a symlink named as its source, so the link
	// cannot reach outside the root through one.
	return x.r.Link(path.Join(parent, base), target)
}

// setAttrs gives name the owner, mode and times of its entry.
func (x *extractor) setAttrs(name string, hdr *tar.Header) error {
	mode := uint32(hdr.Mode & 0o7777)
	if hdr.Typeflag == tar.TypeDir && !x.r.asRoot {
		// Without root's override, later entries (or layers) could not be
		// written into a read-only directory.
		mode |= 0o700
	}
	return x.r.SetAttrs(name, Attrs{Mode: mode, UID: hdr.Uid, GID: hdr.Gid, AccessTime: hdr.AccessTime, ModTime: hdr.ModTime})
}

// removeLower deletes what lower layers left under the directory rel,
// keeping every path this layer wrote.
func (x *extractor) removeLower(rel string) error {
	host, err := x.r.resolve(rel, true)
	if err != nil {
		return err
	}
	d, err := x.r.Open(host)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, e := range entries {
		childRel := path.Join(rel, e.Name())
		childHost := path.Join(host, e.Name())
		if !x.written[childRel] {
			if err := x.r.RemoveAll(childHost); err != nil {
				return err
			}
			continue
		}
		if e.IsDir() {
			if err := x.removeLower(childRel); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteTar writes the tree of r into tw, each name under prefix: only
// directories, regular files and symlinks are data, and sockets, pipes and
// devices are skipped. Owners are kept as numbers.
func WriteTar(tw *tar.Writer, r *Root, prefix string) error {
	return fs.WalkDir(r.FS(), ".", func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := path.Join(prefix, p)
		// Lstat through the root, not the walk's own, so a tree changing
		// underneath cannot point it outside.
		info, err := r.Lstat(p)
		if err != nil {
			return err
		}
		var link string
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = r.Readlink(p); err != nil {
				return err
			}
		case info.IsDir(), info.Mode().IsRegular():
		default:
			slog.Debug("archive: skipping special file", "file", name, "type", info.Mode().Type().String())
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		hdr.Name = name
		hdr.Uname, hdr.Gname = "", ""
		hdr.Format = tar.FormatPAX // keeps long names and sub-second times
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		src, err := r.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		if _, err := io.Copy(tw, src); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

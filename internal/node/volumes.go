package node

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// durableVolumes lists the template's durable volume names: the ones that
// live in host directories and travel in snapshots.
func durableVolumes(t *torporv1.TemplateSpec) []string {
	var names []string
	for _, v := range t.GetVolumes() {
		if v.GetKind() == torporv1.VolumeKind_VOLUME_KIND_DURABLE {
			names = append(names, v.GetName())
		}
	}
	return names
}

// prepareVolumes makes root hold exactly the actor's durable volumes: the
// contents of archive when given (a data.tar of a snapshot), else empty
// directories. Whatever root held before is replaced. The tree is built
// aside and renamed into place, so a failure leaves no half-filled volume.
func prepareVolumes(root string, names []string, archive string) (map[string]string, error) {
	if err := os.MkdirAll(filepath.Dir(root), 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(root), "."+filepath.Base(root)+".new-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	if archive != "" {
		if err := extractVolumes(archive, tmp); err != nil {
			return nil, err
		}
	}
	dirs := make(map[string]string, len(names))
	for _, name := range names {
		if err := os.Mkdir(filepath.Join(tmp, name), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("volume %s: %w", name, err)
		}
		dirs[name] = filepath.Join(root, name)
	}
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("remove old volumes %s: %w", root, err)
	}
	if err := os.Rename(tmp, root); err != nil {
		return nil, err
	}
	return dirs, nil
}

// archiveVolumes writes the named volumes under root into a tar at dest,
// each under its name. Only directories, regular files and symlinks are
// data; sockets, pipes and devices a workload left behind are skipped.
func archiveVolumes(root string, names []string, dest string) (err error) {
	f, err := os.Create(dest)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	for _, name := range names {
		if err := archiveTree(tw, filepath.Join(root, name), name); err != nil {
			return fmt.Errorf("volume %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

func archiveTree(tw *tar.Writer, dir, prefix string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(filepath.Join(prefix, rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		case info.IsDir(), info.Mode().IsRegular():
		default:
			slog.Debug("volume archive: skipping special file", "file", path, "type", info.Mode().Type().String())
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
		src, err := os.Open(path)
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

// extractVolumes unpacks a volume archive into the empty directory root.
// Entries may not leave root, neither by name nor through a symlink the
// archive itself created.
func extractVolumes(archive, root string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	asRoot := os.Geteuid() == 0
	symlinks := map[string]bool{}
	type dirTime struct {
		path string
		mod  time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("volume archive: %w", err)
		}
		rel, err := archivePath(hdr.Name, symlinks)
		if err != nil {
			return fmt.Errorf("volume archive: entry %q: %w", hdr.Name, err)
		}
		target := filepath.Join(root, rel)
		mode := os.FileMode(hdr.Mode) & os.ModePerm
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("volume archive: %w", err)
			}
			dirs = append(dirs, dirTime{target, hdr.ModTime})
		case tar.TypeReg:
			if err := writeArchivedFile(target, tr, mode); err != nil {
				return fmt.Errorf("volume archive: %s: %w", rel, err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return fmt.Errorf("volume archive: %w", err)
			}
			symlinks[rel] = true
		default:
			return fmt.Errorf("volume archive: entry %q: unsupported type %q", hdr.Name, hdr.Typeflag)
		}
		if asRoot {
			if err := os.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
				return fmt.Errorf("volume archive: %w", err)
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			continue
		}
		// chown clears setuid and setgid bits, so the mode goes after it.
		if err := unix.Chmod(target, uint32(hdr.Mode&0o7777)); err != nil {
			return fmt.Errorf("volume archive: chmod %s: %w", rel, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := os.Chtimes(target, hdr.ModTime, hdr.ModTime); err != nil {
				return fmt.Errorf("volume archive: %w", err)
			}
		}
	}
	// Directory times last, deepest first: creating entries changes them.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chtimes(dirs[i].path, dirs[i].mod, dirs[i].mod); err != nil {
			return fmt.Errorf("volume archive: %w", err)
		}
	}
	return nil
}

// archivePath checks an entry name and returns it as a relative host path.
func archivePath(name string, symlinks map[string]bool) (string, error) {
	clean := strings.TrimSuffix(name, "/")
	if clean == "" || strings.HasPrefix(clean, "/") {
		return "", errors.New("not a relative path")
	}
	segs := strings.Split(clean, "/")
	for i, seg := range segs {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("bad path segment %q", seg)
		}
		if i < len(segs)-1 && symlinks[filepath.Join(segs[:i+1]...)] {
			return "", errors.New("path goes through a symlink")
		}
	}
	return filepath.Join(segs...), nil
}

func writeArchivedFile(path string, r io.Reader, mode os.FileMode) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode|0o200)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

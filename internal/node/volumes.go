package node

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/fstree"
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
func prepareVolumes(ctx context.Context, root string, names []string, archive string) (map[string]string, error) {
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
		if err := extractVolumes(ctx, archive, tmp); err != nil {
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
		if err := archiveVolume(tw, filepath.Join(root, name), name); err != nil {
			return fmt.Errorf("volume %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

func archiveVolume(tw *tar.Writer, dir, name string) error {
	r, err := fstree.Open(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	return fstree.WriteTar(tw, r, name)
}

// extractVolumes unpacks a volume archive into the empty directory root.
// Entries may not leave root, neither by name nor through a symlink the
// archive itself created.
func extractVolumes(ctx context.Context, archive, root string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := fstree.Open(root)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := fstree.Extract(ctx, r, bufio.NewReaderSize(f, 1<<20)); err != nil {
		return fmt.Errorf("volume archive: %w", err)
	}
	return nil
}

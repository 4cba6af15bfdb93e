package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/torpor-dev/torpor/internal/fstree"
)

// RootfsSpec describes a single-layer linux image made from a root
// filesystem the user already has, with no container engine: a directory
// (debootstrap's, an unpacked release, a build's output) or a tar of one.
type RootfsSpec struct {
	// Source is the root filesystem: a directory, or a tar of one
	// (gzip-compressed or not), its entries relative to /.
	Source string
	// Config is the image's runtime configuration: entrypoint, command,
	// environment, working directory, user.
	Config v1.Config
	// Tag is recorded as the image's ref.name annotation in index.json.
	Tag string
}

// BuildFromRootfs writes the image spec describes as the only image of a
// new OCI image layout at dir, replacing any layout there, and returns the
// image's manifest digest. A directory's files keep their modes, owners
// (as numbers) and symlinks; sockets, pipes and devices are left out.
func BuildFromRootfs(ctx context.Context, dir string, spec RootfsSpec) (v1.Hash, error) {
	info, err := os.Stat(spec.Source)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("root filesystem: %w", err)
	}
	layerFile := spec.Source
	if info.IsDir() {
		if inside(dir, spec.Source) {
			return v1.Hash{}, fmt.Errorf("image layout %s is inside the root filesystem %s: write it elsewhere", dir, spec.Source)
		}
		tmp, err := os.CreateTemp("", "torpor-rootfs-*.tar")
		if err != nil {
			return v1.Hash{}, fmt.Errorf("root filesystem %s: %w", spec.Source, err)
		}
		defer os.Remove(tmp.Name())
		err = archiveDir(tmp, spec.Source)
		if closeErr := tmp.Close(); err == nil {
			err = closeErr
		}
		if err != nil {
			return v1.Hash{}, fmt.Errorf("root filesystem %s: %w", spec.Source, err)
		}
		layerFile = tmp.Name()
	} else if err := checkTar(spec.Source); err != nil {
		return v1.Hash{}, fmt.Errorf("root filesystem %s: want a directory or a tar of one: %w", spec.Source, err)
	}
	if err := ctx.Err(); err != nil {
		return v1.Hash{}, err
	}
	layer, err := tarball.LayerFromFile(layerFile, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return v1.Hash{}, fmt.Errorf("root filesystem %s: %w", spec.Source, err)
	}
	img, err := singleLayerImage(layer, hostPlatform(), spec.Config)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image layout %s: %w", dir, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image layout %s: %w", dir, err)
	}
	err = replaceLayout(dir, func(p ocilayout.Path) error {
		return p.AppendImage(img, ocilayout.WithAnnotations(tagAnnotation(spec.Tag)))
	})
	return digest, err
}

// archiveDir writes the tree at dir as a tar to w, names relative to /.
func archiveDir(w io.Writer, dir string) error {
	root, err := fstree.Open(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	buf := bufio.NewWriter(w)
	tw := tar.NewWriter(buf)
	if err := fstree.WriteTar(tw, root, ""); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return buf.Flush()
}

// checkTar reads the first entry of the tar at p, through gzip if it is
// compressed, so a wrong file is refused here and not at unpack.
func checkTar(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		r = zr
	}
	if _, err := tar.NewReader(r).Next(); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// inside reports whether path p is dir or below it.
func inside(p, dir string) bool {
	absP, err1 := filepath.Abs(p)
	absDir, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(absDir, absP)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

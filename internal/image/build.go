package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// LayoutSpec describes a single-layer linux image built from files on
// the host.
type LayoutSpec struct {
	// Files maps an absolute guest path to the host file copied there with
	// its permission bits.
	Files map[string]string
	// Dirs maps an absolute guest path to the mode of a directory created
	// there, e.g. "/tmp": fs.ModeSticky|0o777.
	Dirs map[string]fs.FileMode
	// Config is the image's runtime configuration (entrypoint, env, ...).
	Config v1.Config
	// Tag is recorded as the image's ref.name annotation in index.json.
	Tag string
	// Architecture is the GOARCH the files are built for. Default this
	// machine's.
	Architecture string
}

// BuildLayout writes the image spec describes as the only image of a new OCI
// image layout at dir, replacing any layout there, and returns the image's
// manifest digest. Entries carry fixed owners and times, so the same inputs
// always produce the same digest.
func BuildLayout(ctx context.Context, dir string, spec LayoutSpec) (v1.Hash, error) {
	img, err := spec.image(ctx)
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

// BuildIndex writes a new OCI image layout at dir, replacing any layout
// there, holding one multi-platform image: an index, tagged tag, of the
// images specs describe (one per architecture; their own Tag is not
// used). It returns the index's digest.
func BuildIndex(ctx context.Context, dir, tag string, specs []LayoutSpec) (v1.Hash, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, spec := range specs {
		img, err := spec.image(ctx)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("image layout %s: %s: %w", dir, spec.platform().Architecture, err)
		}
		platform := spec.platform()
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platform}})
	}
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image layout %s: %w", dir, err)
	}
	err = replaceLayout(dir, func(p ocilayout.Path) error {
		return p.AppendIndex(idx, ocilayout.WithAnnotations(tagAnnotation(tag)))
	})
	return digest, err
}

func tagAnnotation(tag string) map[string]string {
	if tag == "" {
		return nil
	}
	return map[string]string{RefNameAnnotation: tag}
}

func (spec LayoutSpec) platform() v1.Platform {
	p := hostPlatform()
	if spec.Architecture != "" {
		p.Architecture = spec.Architecture
	}
	return p
}

// image builds the image spec describes.
func (spec LayoutSpec) image(ctx context.Context) (v1.Image, error) {
	layerTar, err := layerTar(spec)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return singleLayerImage(layer, spec.platform(), spec.Config)
}

// singleLayerImage is an OCI image of layer alone, for platform, running
// as config says.
func singleLayerImage(layer v1.Layer, platform v1.Platform, config v1.Config) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = platform.OS, platform.Architecture
	cf.Config = config
	return mutate.ConfigFile(img, cf)
}

// replaceLayout makes a new, empty layout aside, lets add fill it and moves
// it to dir, so a reader never sees a layout that is half old, half new.
func replaceLayout(dir string, add func(ocilayout.Path) error) error {
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	p, err := ocilayout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	if err := add(p); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	return nil
}

// layerTar builds the layer's tar: every file and directory of spec, with
// the parent directories they need, sorted by path.
func layerTar(spec LayoutSpec) ([]byte, error) {
	dirs := map[string]fs.FileMode{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	for guest, mode := range spec.Dirs {
		if !path.IsAbs(guest) || path.Clean(guest) != guest || guest == "/" {
			return nil, fmt.Errorf("directory %q: want a clean absolute path below /", guest)
		}
		dirs[guest] = mode
		addParents(guest)
	}
	for guest := range spec.Files {
		if !path.IsAbs(guest) || path.Clean(guest) != guest || guest == "/" {
			return nil, fmt.Errorf("file %q: want a clean absolute path below /", guest)
		}
		if _, ok := spec.Dirs[guest]; ok {
			return nil, fmt.Errorf("file %q: also listed as a directory", guest)
		}
		addParents(guest)
	}
	for guest := range spec.Files {
		if _, ok := dirs[guest]; ok {
			return nil, fmt.Errorf("file %q: also the parent directory of another entry", guest)
		}
	}

	names := make([]string, 0, len(dirs)+len(spec.Files))
	for d := range dirs {
		names = append(names, d)
	}
	for f := range spec.Files {
		names = append(names, f)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// Fixed times make the layer, and so the image digest, reproducible.
	epoch := time.Unix(0, 0)
	for _, guest := range names {
		name := strings.TrimPrefix(guest, "/")
		if mode, ok := dirs[guest]; ok {
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: tarMode(mode), ModTime: epoch}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		if err := addFile(tw, name, spec.Files[guest], epoch); err != nil {
			return nil, fmt.Errorf("file %q: %w", guest, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func addFile(tw *tar.Writer, name, hostPath string, modTime time.Time) error {
	f, err := os.Open(hostPath)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", hostPath)
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: tarMode(fi.Mode()), Size: fi.Size(), ModTime: modTime}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: %w", hostPath, err)
	}
	return nil
}

// tarMode converts a Go file mode to the Unix mode bits a tar header holds.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

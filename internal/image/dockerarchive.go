package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// dockerArchive is a `docker save` archive (manifest.json, each image's
// config and layer tars under names of Docker's choosing) seen as an OCI
// image layout. manifest.json names files, not digests, so every file is
// hashed once when the archive is opened, and each image gets the manifest
// those digests make: its digest is what pins the image, and reading a blob
// checks it as for any layout.
type dockerArchive struct {
	index v1.IndexManifest
	// manifests holds the manifest made for each image, by digest.
	manifests map[v1.Hash][]byte
	// files names the archive's file holding each config and layer blob.
	files map[v1.Hash]string
}

// dockerImage is one entry of manifest.json, as Docker writes it.
type dockerImage struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// compression magics of the layer formats Docker and OCI use.
var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

func readDockerArchive(files layoutFiles, where string) (*dockerArchive, error) {
	rc, err := files.open("manifest.json")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	defer rc.Close()
	var images []dockerImage
	if err := json.NewDecoder(rc).Decode(&images); err != nil {
		return nil, fmt.Errorf("%s: manifest.json: %w", where, err)
	}
	a := &dockerArchive{
		index:     v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex},
		manifests: map[v1.Hash][]byte{},
		files:     map[v1.Hash]string{},
	}
	for i, img := range images {
		raw, err := a.addImage(files, img)
		if err != nil {
			return nil, fmt.Errorf("%s: manifest.json image %d: %w", where, i, err)
		}
		digest, size, err := v1.SHA256(bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		a.manifests[digest] = raw
		desc := v1.Descriptor{MediaType: types.DockerManifestSchema2, Digest: digest, Size: size}
		if len(img.RepoTags) == 0 {
			a.index.Manifests = append(a.index.Manifests, desc)
		}
		// One index entry per tag: a layout names an image by the tag
		// part of a reference (counter:latest is "latest").
		for _, repoTag := range img.RepoTags {
			d := desc
			d.Annotations = map[string]string{RefNameAnnotation: tagOf(repoTag)}
			a.index.Manifests = append(a.index.Manifests, d)
		}
	}
	return a, nil
}

// addImage hashes the files of img and returns the manifest they make.
func (a *dockerArchive) addImage(files layoutFiles, img dockerImage) ([]byte, error) {
	if img.Config == "" {
		return nil, fmt.Errorf("no Config")
	}
	config, _, err := a.addBlob(files, img.Config)
	if err != nil {
		return nil, err
	}
	config.MediaType = types.DockerConfigJSON
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.DockerManifestSchema2, Config: config}
	for _, name := range img.Layers {
		layer, head, err := a.addBlob(files, name)
		if err != nil {
			return nil, err
		}
		// Docker writes layers uncompressed; go-containerregistry's
		// tarball.Write, gzipped.
		switch {
		case bytes.HasPrefix(head, gzipMagic):
			layer.MediaType = types.DockerLayer
		case bytes.HasPrefix(head, zstdMagic):
			layer.MediaType = types.OCILayerZStd
		default:
			layer.MediaType = types.DockerUncompressedLayer
		}
		m.Layers = append(m.Layers, layer)
	}
	return json.Marshal(m)
}

// addBlob hashes the archive's file name and records it as the blob of
// that digest; head is the start of its content.
func (a *dockerArchive) addBlob(files layoutFiles, name string) (desc v1.Descriptor, head []byte, err error) {
	name = path.Clean(strings.TrimLeft(name, "/"))
	rc, err := files.open(name)
	if err != nil {
		return v1.Descriptor{}, nil, err
	}
	defer rc.Close()
	head = make([]byte, len(zstdMagic))
	k, err := io.ReadFull(rc, head)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return v1.Descriptor{}, nil, fmt.Errorf("%s: %w", name, err)
	}
	head = head[:k]
	h := sha256.New()
	h.Write(head)
	n, err := io.Copy(h, rc)
	if err != nil {
		return v1.Descriptor{}, nil, fmt.Errorf("%s: %w", name, err)
	}
	digest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	a.files[digest] = name
	return v1.Descriptor{Digest: digest, Size: int64(k) + n}, head, nil
}

// open opens the blob with digest d; ok is false when the archive has none.
func (a *dockerArchive) open(files layoutFiles, d v1.Hash) (rc io.ReadCloser, ok bool, err error) {
	if raw, found := a.manifests[d]; found {
		return io.NopCloser(bytes.NewReader(raw)), true, nil
	}
	name, found := a.files[d]
	if !found {
		return nil, false, nil
	}
	rc, err = files.open(name)
	return rc, true, err
}

// tagOf is the tag of a repository tag such as registry:5000/repo:tag.
func tagOf(repoTag string) string {
	i := strings.LastIndexByte(repoTag, ':')
	if i < 0 || strings.Contains(repoTag[i:], "/") {
		return "latest"
	}
	return repoTag[i+1:]
}

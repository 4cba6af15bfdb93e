package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/torpor-dev/torpor/internal/fstree"
)

// layoutFiles reads the files of an OCI image layout by their slash path
// inside it ("index.json", "blobs/sha256/<hex>").
type layoutFiles interface {
	open(name string) (io.ReadCloser, error)
	io.Closer
}

// layout reads an OCI image layout (a directory, or a tar of one) and checks
// every blob it reads against its digest: unlike a registry client, the
// go-containerregistry layout reader trusts the files on disk. A `docker
// save` archive (or a directory of one) is read as the layout it amounts to.
type layout struct {
	path  string
	files layoutFiles
	// docker is set when the files are a docker save archive, not an OCI
	// image layout.
	docker *dockerArchive
}

func openLayout(p string) (*layout, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("OCI image layout: %w", err)
	}
	var files layoutFiles
	if fi.IsDir() {
		files = dirFiles(p)
	} else {
		files, err = openTarFiles(p)
		if err != nil {
			return nil, err
		}
	}
	l := &layout{path: p, files: files}
	if err := l.detect(); err != nil {
		files.Close()
		return nil, err
	}
	return l, nil
}

// detect tells an OCI image layout (index.json) from a docker save archive
// (manifest.json only; Docker 25 and later write both, and the OCI index
// is the richer of the two).
func (l *layout) detect() error {
	_, err := l.index()
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	rc, merr := l.files.open("manifest.json")
	if merr != nil {
		return fmt.Errorf("%s is not an OCI image layout or docker save archive: it has neither index.json nor manifest.json", l.path)
	}
	rc.Close()
	l.docker, err = readDockerArchive(l.files, l.path)
	return err
}

func (l *layout) Close() error { return l.files.Close() }

// index reads index.json, the layout's root. Nothing names its digest, so it
// is the one file read unverified.
func (l *layout) index() (*v1.IndexManifest, error) {
	if l.docker != nil {
		return &l.docker.index, nil
	}
	rc, err := l.files.open("index.json")
	if err != nil {
		return nil, fmt.Errorf("%s is not an OCI image layout: %w", l.path, err)
	}
	defer rc.Close()
	var idx v1.IndexManifest
	if err := json.NewDecoder(rc).Decode(&idx); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", l.path, err)
	}
	return &idx, nil
}

// blob opens the blob with digest d; the reader fails at its end when the
// content does not match d or size.
func (l *layout) blob(d v1.Hash, size int64) (io.ReadCloser, error) {
	if d.Algorithm != "sha256" || len(d.Hex) != sha256.Size*2 {
		return nil, fmt.Errorf("%s: unsupported digest %q", l.path, d)
	}
	var rc io.ReadCloser
	var err error
	if l.docker != nil {
		var ok bool
		if rc, ok, err = l.docker.open(l.files, d); !ok && err == nil {
			err = fs.ErrNotExist
		}
	} else {
		rc, err = l.files.open("blobs/sha256/" + d.Hex)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: blob %s: %w", l.path, d, err)
	}
	return &verifyingReader{rc: rc, hash: sha256.New(), want: d, size: size, where: l.path}, nil
}

func (l *layout) blobBytes(desc v1.Descriptor) ([]byte, error) {
	rc, err := l.blob(desc.Digest, desc.Size)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// selectImage finds the image manifest r names: by digest anywhere in the
// layout, else by tag, else the layout's only entry.
func (l *layout) selectImage(r layoutRef) (v1.Descriptor, error) {
	idx, err := l.index()
	if err != nil {
		return v1.Descriptor{}, err
	}
	if r.digest != (v1.Hash{}) {
		desc, err := l.find(idx, r.digest)
		if err != nil {
			return v1.Descriptor{}, err
		}
		return l.platformImage(desc)
	}
	var matches []v1.Descriptor
	var tags []string
	// One image under several tags is still one image.
	seen := map[v1.Hash]bool{}
	for _, m := range idx.Manifests {
		tag := m.Annotations[RefNameAnnotation]
		if tag != "" {
			tags = append(tags, tag)
		}
		if (r.tag == "" || tag == r.tag) && !seen[m.Digest] {
			seen[m.Digest] = true
			matches = append(matches, m)
		}
	}
	sort.Strings(tags)
	switch {
	case len(matches) == 1:
		return l.platformImage(matches[0])
	case r.tag != "" && len(matches) == 0:
		return v1.Descriptor{}, fmt.Errorf("%s has no image tagged %q (tags: %s)", l.path, r.tag, strings.Join(tags, ", "))
	case r.tag != "":
		return v1.Descriptor{}, fmt.Errorf("%s has %d images tagged %q", l.path, len(matches), r.tag)
	case len(matches) == 0:
		return v1.Descriptor{}, fmt.Errorf("%s holds no images", l.path)
	default:
		return v1.Descriptor{}, fmt.Errorf("%s holds %d images: name one by tag (tags: %s) or digest", l.path, len(matches), strings.Join(tags, ", "))
	}
}

// find looks d up in idx and, depth first, in the indexes it references.
func (l *layout) find(idx *v1.IndexManifest, d v1.Hash) (v1.Descriptor, error) {
	desc, ok, err := l.search(idx, d)
	if err != nil {
		return v1.Descriptor{}, err
	}
	if !ok {
		return v1.Descriptor{}, fmt.Errorf("%s has no manifest %s", l.path, d)
	}
	return desc, nil
}

func (l *layout) search(idx *v1.IndexManifest, d v1.Hash) (v1.Descriptor, bool, error) {
	for _, m := range idx.Manifests {
		if m.Digest == d {
			return m, true, nil
		}
	}
	for _, m := range idx.Manifests {
		if !m.MediaType.IsIndex() {
			continue
		}
		child, err := l.childIndex(m)
		if err != nil {
			return v1.Descriptor{}, false, err
		}
		if desc, ok, err := l.search(child, d); ok || err != nil {
			return desc, ok, err
		}
	}
	return v1.Descriptor{}, false, nil
}

func (l *layout) childIndex(desc v1.Descriptor) (*v1.IndexManifest, error) {
	raw, err := l.blobBytes(desc)
	if err != nil {
		return nil, err
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: index %s: %w", l.path, desc.Digest, err)
	}
	return idx, nil
}

// platformImage returns desc if it is an image, or the linux image for this
// machine's architecture if it is a multi-platform index.
func (l *layout) platformImage(desc v1.Descriptor) (v1.Descriptor, error) {
	if desc.MediaType.IsImage() {
		return desc, nil
	}
	if !desc.MediaType.IsIndex() {
		return v1.Descriptor{}, fmt.Errorf("%s: manifest %s has media type %q, not an image", l.path, desc.Digest, desc.MediaType)
	}
	idx, err := l.childIndex(desc)
	if err != nil {
		return v1.Descriptor{}, err
	}
	want := hostPlatform()
	var have []string
	for _, m := range idx.Manifests {
		if m.Platform != nil && m.Platform.OS == want.OS && m.Platform.Architecture == want.Architecture {
			return l.platformImage(m)
		}
		if m.Platform != nil {
			have = append(have, m.Platform.String())
		}
	}
	return v1.Descriptor{}, fmt.Errorf("%s: index %s has no %s image (has %s)", l.path, desc.Digest, want, strings.Join(have, ", "))
}

func hostPlatform() v1.Platform {
	return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
}

// image returns the image desc names, reading through l.
func (l *layout) image(desc v1.Descriptor) (v1.Image, error) {
	return partial.CompressedToImage(&layoutImage{layout: l, desc: desc})
}

// layoutImage is the minimal core go-containerregistry needs to build a
// v1.Image; manifest and config are read once and verified.
type layoutImage struct {
	layout *layout
	desc   v1.Descriptor

	mu          sync.Mutex
	rawManifest []byte
	manifest    *v1.Manifest
	rawConfig   []byte
}

func (li *layoutImage) MediaType() (types.MediaType, error) { return li.desc.MediaType, nil }

func (li *layoutImage) RawManifest() ([]byte, error) {
	li.mu.Lock()
	defer li.mu.Unlock()
	return li.loadManifest()
}

func (li *layoutImage) loadManifest() ([]byte, error) {
	if li.rawManifest != nil {
		return li.rawManifest, nil
	}
	raw, err := li.layout.blobBytes(li.desc)
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: manifest %s: %w", li.layout.path, li.desc.Digest, err)
	}
	li.rawManifest, li.manifest = raw, m
	return raw, nil
}

func (li *layoutImage) RawConfigFile() ([]byte, error) {
	li.mu.Lock()
	defer li.mu.Unlock()
	if li.rawConfig != nil {
		return li.rawConfig, nil
	}
	if _, err := li.loadManifest(); err != nil {
		return nil, err
	}
	raw, err := li.layout.blobBytes(li.manifest.Config)
	if err != nil {
		return nil, err
	}
	li.rawConfig = raw
	return raw, nil
}

func (li *layoutImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	li.mu.Lock()
	defer li.mu.Unlock()
	if _, err := li.loadManifest(); err != nil {
		return nil, err
	}
	if h == li.manifest.Config.Digest {
		return &layoutBlob{layout: li.layout, desc: li.manifest.Config}, nil
	}
	for _, d := range li.manifest.Layers {
		if d.Digest == h {
			return &layoutBlob{layout: li.layout, desc: d}, nil
		}
	}
	return nil, fmt.Errorf("%s: image %s has no layer %s", li.layout.path, li.desc.Digest, h)
}

type layoutBlob struct {
	layout *layout
	desc   v1.Descriptor
}

func (b *layoutBlob) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b *layoutBlob) Size() (int64, error)                { return b.desc.Size, nil }
func (b *layoutBlob) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }
func (b *layoutBlob) Compressed() (io.ReadCloser, error) {
	return b.layout.blob(b.desc.Digest, b.desc.Size)
}
func (b *layoutBlob) Descriptor() (*v1.Descriptor, error) { return &b.desc, nil }

// verifyingReader hashes what it passes on and, at the end of the stream,
// turns a digest or size mismatch into an error, so nothing reads corrupt
// content to completion unnoticed.
type verifyingReader struct {
	rc    io.ReadCloser
	hash  hash.Hash
	want  v1.Hash
	size  int64
	read  int64
	where string
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.hash.Write(p[:n])
	v.read += int64(n)
	if v.size > 0 && v.read > v.size {
		return n, fmt.Errorf("%s: blob %s is larger than its descriptor's %d bytes", v.where, v.want, v.size)
	}
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(v.hash.Sum(nil)); got != v.want.Hex {
			return n, fmt.Errorf("%s: blob %s is corrupt: content has digest sha256:%s", v.where, v.want, got)
		}
		if v.size > 0 && v.read != v.size {
			return n, fmt.Errorf("%s: blob %s has %d bytes, its descriptor says %d", v.where, v.want, v.read, v.size)
		}
	}
	return n, err
}

func (v *verifyingReader) Close() error { return v.rc.Close() }

// dirFiles is a layout stored as a directory.
type dirFiles string

func (d dirFiles) open(name string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), filepath.FromSlash(name)))
}

func (d dirFiles) Close() error { return nil }

// tarFiles is a layout stored as a tar file. It is indexed once so that each
// blob is read in place, without unpacking the tar first.
type tarFiles struct {
	f       *os.File
	entries map[string]tarEntry
}

// tarEntry is a file's content in the tar, or the name it links to
// (docker save links a layer that two images share).
type tarEntry struct {
	offset, size int64
	link         string
}

func openTarFiles(p string) (*tarFiles, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("OCI image layout: %w", err)
	}
	t := &tarFiles{f: f, entries: map[string]tarEntry{}}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			f.Close()
			return nil, notATar(p, err)
		}
		name := path.Clean(strings.TrimLeft(hdr.Name, "/"))
		switch hdr.Typeflag {
		case tar.TypeSymlink:
			target := hdr.Linkname
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(name), target)
			}
			t.entries[name] = tarEntry{link: path.Clean(strings.TrimLeft(target, "/"))}
			continue
		case tar.TypeLink:
			t.entries[name] = tarEntry{link: path.Clean(strings.TrimLeft(hdr.Linkname, "/"))}
			continue
		case tar.TypeReg:
		default:
			continue
		}
		// archive/tar reads exactly the header blocks from an *os.File, so
		// the file offset is now the start of this entry's content.
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		t.entries[name] = tarEntry{offset: off, size: hdr.Size}
	}
	return t, nil
}

// notATar explains why the file p could not be read as a tar.
func notATar(p string, err error) error {
	head := make([]byte, len(zstdMagic))
	if f, oerr := os.Open(p); oerr == nil {
		n, _ := io.ReadFull(f, head)
		head = head[:n]
		f.Close()
	}
	if bytes.HasPrefix(head, gzipMagic) || bytes.HasPrefix(head, zstdMagic) {
		return fmt.Errorf("%s is a compressed file: decompress it (gunzip, zstd -d) to the tar of an OCI image layout or docker save archive", p)
	}
	return fmt.Errorf("%s is neither a directory nor a tar of an OCI image layout or docker save archive: %w", p, err)
}

func (t *tarFiles) open(name string) (io.ReadCloser, error) {
	e, ok := t.entries[name]
	for hops := 0; ok && e.link != ""; hops++ {
		if hops == fstree.MaxLinkHops {
			return nil, fmt.Errorf("%s: %s: too many levels of links", t.f.Name(), name)
		}
		e, ok = t.entries[e.link]
	}
	if !ok {
		return nil, fmt.Errorf("%s: %s: %w", t.f.Name(), name, fs.ErrNotExist)
	}
	return io.NopCloser(io.NewSectionReader(t.f, e.offset, e.size)), nil
}

func (t *tarFiles) Close() error { return t.f.Close() }

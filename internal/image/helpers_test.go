package image

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one tar entry of a test layer.
type entry struct {
	name string
	typ  byte // tar.TypeReg when zero
	body string
	mode int64 // 0o644 (files) or 0o755 (dirs) when zero
	link string
}

func file(name, body string) entry      { return entry{name: name, body: body} }
func dir(name string) entry             { return entry{name: name, typ: tar.TypeDir} }
func symlink(name, target string) entry { return entry{name: name, typ: tar.TypeSymlink, link: target} }
func hardlink(name, target string) entry {
	return entry{name: name, typ: tar.TypeLink, link: target}
}

func tarOf(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
			if hdr.Typeflag == tar.TypeDir {
				hdr.Mode = 0o755
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %s: %v", e.name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("tar body %s: %v", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layer is an uncompressed layer, so a test can corrupt a byte of a file's
// content and still have a readable tar.
func layer(t *testing.T, entries ...entry) v1.Layer {
	return static.NewLayer(tarOf(t, entries...), types.OCIUncompressedLayer)
}

func imageOf(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = hostPlatform().OS, hostPlatform().Architecture
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digestOf(t *testing.T, d interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// tagged is one entry of a test layout's index.json.
type tagged struct {
	tag string
	img v1.Image      // or
	idx v1.ImageIndex // a multi-platform index
}

func writeLayout(t *testing.T, dir string, entries ...tagged) {
	t.Helper()
	p, err := ocilayout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		var opts []ocilayout.Option
		if e.tag != "" {
			opts = append(opts, ocilayout.WithAnnotations(map[string]string{RefNameAnnotation: e.tag}))
		}
		if e.idx != nil {
			err = p.AppendIndex(e.idx, opts...)
		} else {
			err = p.AppendImage(e.img, opts...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// tarDir writes a tar of the directory src, names prefixed with "./" as
// `tar -C src .` writes them.
func tarDir(t *testing.T, src, dst string) {
	t.Helper()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = "./" + filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// anywhere is a policy that lets tests read local images wherever they
// write them (and no registry).
var anywhere = func() *Policy {
	p, err := NewPolicy(PolicyConfig{Dirs: []string{"/"}})
	if err != nil {
		panic(err)
	}
	return p
}()

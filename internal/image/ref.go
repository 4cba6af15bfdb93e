// Package image resolves container image references to digests, builds
// small OCI image layouts, and unpacks images into a per-digest cache of
// root filesystems for the sandbox runtimes.
//
// A reference is either a local image, written oci:PATH[:TAG|@sha256:HEX]
// where PATH is an OCI image layout directory, a tar of one, or a `docker
// save` archive (or a directory of one), or a registry reference
// (registry/repo:tag or registry/repo@sha256:HEX). Templates store
// references pinned by digest, so an actor always boots the exact image its
// template was applied with; docs/images.md is the user's guide.
package image

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// LayoutScheme prefixes references to local OCI image layouts.
const LayoutScheme = "oci:"

// RefNameAnnotation is the index.json annotation that carries a tag in an
// OCI image layout.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// tagPattern is the tag grammar of the OCI distribution spec. A path
// component after the last ':' that does not match it is part of the path.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// layoutRef names an image in an OCI image layout on this machine.
type layoutRef struct {
	path   string  // absolute
	tag    string  // empty when untagged
	digest v1.Hash // zero unless pinned; wins over tag, as in registry refs
}

func (r layoutRef) pinned(digest v1.Hash) string {
	return LayoutScheme + r.path + "@" + digest.String()
}

// parseLayoutRef parses an oci: reference; a relative PATH is taken
// relative to baseDir (for a template, the directory of its file).
func parseLayoutRef(ref, baseDir string) (layoutRef, error) {
	rest, ok := strings.CutPrefix(ref, LayoutScheme)
	if !ok {
		return layoutRef{}, fmt.Errorf("image %q: not a local layout reference (want %s prefix)", ref, LayoutScheme)
	}
	var r layoutRef
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		d, err := parseDigest(rest[at+1:])
		if err != nil {
			return layoutRef{}, fmt.Errorf("image %q: %w", ref, err)
		}
		r.digest = d
		rest = rest[:at]
	}
	if colon := strings.LastIndex(rest, ":"); colon >= 0 && tagPattern.MatchString(rest[colon+1:]) {
		r.tag = rest[colon+1:]
		rest = rest[:colon]
	}
	if rest == "" {
		return layoutRef{}, fmt.Errorf("image %q: empty layout path", ref)
	}
	if !filepath.IsAbs(rest) {
		if baseDir == "" {
			return layoutRef{}, fmt.Errorf("image %q: relative layout path and no base directory to resolve it against", ref)
		}
		rest = filepath.Join(baseDir, rest)
	}
	abs, err := filepath.Abs(rest)
	if err != nil {
		return layoutRef{}, fmt.Errorf("image %q: %w", ref, err)
	}
	r.path = abs
	return r, nil
}

func parseDigest(s string) (v1.Hash, error) {
	h, err := v1.NewHash(s)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("bad digest %q: %w", s, err)
	}
	if h.Algorithm != "sha256" {
		return v1.Hash{}, fmt.Errorf("bad digest %q: only sha256 is supported", s)
	}
	return h, nil
}

// IsPinned reports whether ref names exactly one image by content:
// a registry reference with @sha256:<64 hex>, or a local layout reference
// with an absolute path and @sha256:<64 hex>. Stored templates must hold
// pinned references only.
func IsPinned(ref string) bool {
	_, err := pinnedDigest(ref)
	return err == nil
}

// pinnedDigest returns the digest of a pinned reference, or why it is not
// pinned.
func pinnedDigest(ref string) (v1.Hash, error) {
	if strings.HasPrefix(ref, LayoutScheme) {
		r, err := parseLayoutRef(ref, "")
		if err != nil {
			return v1.Hash{}, err
		}
		if r.digest == (v1.Hash{}) {
			return v1.Hash{}, fmt.Errorf("image %q: not pinned by digest", ref)
		}
		return r.digest, nil
	}
	d, err := name.NewDigest(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image %q: not pinned by digest: %w", ref, err)
	}
	return parseDigest(d.DigestStr())
}

// Resolve pins ref to the digest of the image it names now: it returns
// oci:/abs/path@sha256:... for a local layout or registry/repo@sha256:...
// for a registry. A relative layout path is taken relative to baseDir.
// A layout holding exactly one image needs no tag; one holding several does.
// A multi-platform index resolves to its linux image for this machine's
// architecture. Resolve is the CLI's, run as the user: a registry is reached
// with the user's own Docker credentials (docker login). The server and the
// nodes never use those: they read images through a Policy.
func Resolve(ctx context.Context, ref, baseDir string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if strings.HasPrefix(ref, LayoutScheme) {
		r, err := parseLayoutRef(ref, baseDir)
		if err != nil {
			return "", err
		}
		l, err := openLayout(r.path)
		if err != nil {
			return "", fmt.Errorf("image %q: %w", ref, err)
		}
		defer l.Close()
		desc, err := l.selectImage(r)
		if err != nil {
			return "", fmt.Errorf("image %q: %w", ref, err)
		}
		return r.pinned(desc.Digest), nil
	}
	if ref == "" {
		return "", errors.New("image reference is empty")
	}
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, err)
	}
	img, err := remoteImage(ctx, parsed, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("image %q: %w", ref, err)
	}
	return parsed.Context().Name() + "@" + digest.String(), nil
}

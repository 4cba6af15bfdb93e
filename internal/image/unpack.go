package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/atomicfile"
	"github.com/torpor-dev/torpor/internal/fstree"
)

// lockPoll is how often a caller waiting for another's unpack of the same
// image retries the lock; polling keeps the wait cancellable.
const lockPoll = 10 * time.Millisecond

// Unpack extracts the image a pinned reference names, if p allows it, into
// cacheDir/<digest hex>/rootfs and returns that path, made absolute; the
// image's configuration is kept beside it (see CachedConfig). The directory
// appears complete or not at all (it is extracted aside and renamed), so a
// later call returns it at once without reading the image. Concurrent calls
// for one digest, in this process or others, extract it once.
func (p *Policy) Unpack(ctx context.Context, pinned, cacheDir string) (string, error) {
	digest, err := pinnedDigest(pinned)
	if err != nil {
		return "", err
	}
	// Even when cached: the policy, not the cache, says what a template
	// may name.
	if err := p.Check(pinned); err != nil {
		return "", err
	}
	// Absolute, because runtimes hand the path to processes with other
	// working directories.
	cacheDir, err = filepath.Abs(cacheDir)
	if err != nil {
		return "", fmt.Errorf("image %q: cache: %w", pinned, err)
	}
	entry := filepath.Join(cacheDir, digest.Hex)
	rootfs := filepath.Join(entry, "rootfs")
	if ok, err := isDir(rootfs); ok || err != nil {
		return rootfs, err
	}
	if err := os.MkdirAll(entry, 0o755); err != nil {
		return "", fmt.Errorf("image %q: cache: %w", pinned, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(entry, "lock"))
	if err != nil {
		return "", fmt.Errorf("image %q: cache lock: %w", pinned, err)
	}
	defer unlock()
	if ok, err := isDir(rootfs); ok || err != nil {
		return rootfs, err
	}
	// Under the lock, leftovers can only be from an unpack that died.
	stale, _ := filepath.Glob(filepath.Join(entry, "rootfs.tmp-*"))
	for _, s := range stale {
		if err := os.RemoveAll(s); err != nil {
			return "", fmt.Errorf("image %q: removing stale %s: %w", pinned, s, err)
		}
	}

	start := time.Now()
	tmp, err := os.MkdirTemp(entry, "rootfs.tmp-")
	if err != nil {
		return "", fmt.Errorf("image %q: %w", pinned, err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("image %q: %w", pinned, err)
	}
	img, closeImage, err := p.openPinned(ctx, pinned)
	if err != nil {
		return "", err
	}
	defer closeImage()
	layers, err := img.Layers()
	if err != nil {
		return "", fmt.Errorf("image %q: %w", pinned, err)
	}
	for i, layer := range layers {
		if err := applyImageLayer(ctx, tmp, layer); err != nil {
			return "", fmt.Errorf("image %q: layer %d: %w", pinned, i, err)
		}
	}
	if _, err := cacheConfig(entry, pinned, img); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, rootfs); err != nil {
		return "", fmt.Errorf("image %q: %w", pinned, err)
	}
	slog.InfoContext(ctx, "unpacked image", "image", pinned, "rootfs", rootfs,
		"layers", len(layers), "duration", time.Since(start))
	return rootfs, nil
}

func applyImageLayer(ctx context.Context, root string, layer v1.Layer) error {
	rc, err := layer.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	r, err := fstree.Open(root)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := fstree.ApplyLayer(ctx, r, rc); err != nil {
		return err
	}
	// The digest is checked when the stream ends; tar stops reading at its
	// end-of-archive marker, which may come before that.
	_, err = io.Copy(io.Discard, rc)
	return err
}

// Config returns the runtime configuration (entrypoint, cmd, env, working
// directory, user) of the image a pinned reference names, if p allows it.
func (p *Policy) Config(ctx context.Context, pinned string) (*v1.Config, error) {
	if _, err := pinnedDigest(pinned); err != nil {
		return nil, err
	}
	img, closeImage, err := p.openPinned(ctx, pinned)
	if err != nil {
		return nil, err
	}
	defer closeImage()
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %q: config: %w", pinned, err)
	}
	return cf.Config.DeepCopy(), nil
}

// configFile is the image configuration kept beside an unpacked rootfs.
const configFile = "config.json"

// CachedConfig is Config read from the node's image cache at cacheDir,
// where Unpack keeps it, so that starting a workload reads no registry.
// A cache entry made before configurations were kept gets its own now.
func (p *Policy) CachedConfig(ctx context.Context, pinned, cacheDir string) (v1.Config, error) {
	digest, err := pinnedDigest(pinned)
	if err != nil {
		return v1.Config{}, err
	}
	if err := p.Check(pinned); err != nil {
		return v1.Config{}, err
	}
	entry := filepath.Join(cacheDir, digest.Hex)
	raw, err := os.ReadFile(filepath.Join(entry, configFile))
	if err == nil {
		var cfg v1.Config
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return v1.Config{}, fmt.Errorf("image %q: cached config: %w", pinned, err)
		}
		return cfg, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return v1.Config{}, fmt.Errorf("image %q: cached config: %w", pinned, err)
	}
	img, closeImage, err := p.openPinned(ctx, pinned)
	if err != nil {
		return v1.Config{}, err
	}
	defer closeImage()
	// As Unpack makes it: runtimes read the entry as other users.
	if err := os.MkdirAll(entry, 0o755); err != nil {
		return v1.Config{}, fmt.Errorf("image %q: cache: %w", pinned, err)
	}
	return cacheConfig(entry, pinned, img)
}

// cacheConfig writes img's configuration into the cache entry and returns it.
func cacheConfig(entry, pinned string, img v1.Image) (v1.Config, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Config{}, fmt.Errorf("image %q: config: %w", pinned, err)
	}
	raw, err := json.Marshal(cf.Config)
	if err != nil {
		return v1.Config{}, fmt.Errorf("image %q: config: %w", pinned, err)
	}
	if err := atomicfile.Write(filepath.Join(entry, configFile), raw, 0o644); err != nil {
		return v1.Config{}, fmt.Errorf("image %q: cache: %w", pinned, err)
	}
	return cf.Config, nil
}

// openPinned opens the image of a pinned reference p allows; the returned
// func releases what reading it holds open.
func (p *Policy) openPinned(ctx context.Context, pinned string) (v1.Image, func() error, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if strings.HasPrefix(pinned, LayoutScheme) {
		r, err := parseLayoutRef(pinned, "")
		if err != nil {
			return nil, nil, err
		}
		// The real path: what was checked is what is opened.
		if r.path, err = p.localPath(pinned, r.path); err != nil {
			return nil, nil, err
		}
		l, err := openLayout(r.path)
		if err != nil {
			return nil, nil, fmt.Errorf("image %q: %w", pinned, err)
		}
		desc, err := l.selectImage(r)
		if err != nil {
			l.Close()
			return nil, nil, fmt.Errorf("image %q: %w", pinned, err)
		}
		img, err := l.image(desc)
		if err != nil {
			l.Close()
			return nil, nil, fmt.Errorf("image %q: %w", pinned, err)
		}
		return img, l.Close, nil
	}
	ref, err := name.NewDigest(pinned)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: %w", pinned, err)
	}
	if err := p.checkRegistry(pinned, ref.Context().Registry); err != nil {
		return nil, nil, err
	}
	img, err := remoteImage(ctx, ref, p.remoteOptions(ref)...)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: %w", pinned, err)
	}
	return img, func() error { return nil }, nil
}

// remoteImage fetches an image from its registry, reached as opts say;
// go-containerregistry verifies every digest.
func remoteImage(ctx context.Context, ref name.Reference, opts ...remote.Option) (v1.Image, error) {
	return remote.Image(ref, append([]remote.Option{remote.WithContext(ctx), remote.WithPlatform(hostPlatform())}, opts...)...)
}

func isDir(p string) (bool, error) {
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("%s is not a directory", p)
	}
	return true, nil
}

// lockFile takes an exclusive flock on p, which excludes other processes
// and other callers in this one alike (each call opens its own descriptor).
func lockFile(ctx context.Context, p string) (unlock func(), err error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(lockPoll):
		}
	}
}

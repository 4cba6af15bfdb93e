package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/atomicfile"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/image"
)

// images are the images this node's policy allows, unpacked under dir.
type images struct {
	policy *image.Policy
	dir    string
	// nameserver, when set, is what a root filesystem without an
	// /etc/resolv.conf gets one naming (see ensureResolvConf).
	nameserver string
}

// unpack returns each container's root filesystem and image
// configuration, unpacked once per image digest on this node. An image
// this node's policy refuses is neither opened nor dialed, even when it is
// cached.
func (im images) unpack(ctx context.Context, w *torporv1.Workload) (rootfs map[string]string, configs map[string]v1.Config, err error) {
	rootfs = make(map[string]string, len(w.GetTemplate().GetContainers()))
	configs = make(map[string]v1.Config, len(w.GetTemplate().GetContainers()))
	for i, c := range w.GetTemplate().GetContainers() {
		if err := im.policy.Check(c.GetImage()); err != nil {
			return nil, nil, invalid(fmt.Sprintf("workload.template.containers[%d].image", i), "%v", err)
		}
		dir, err := im.policy.Unpack(ctx, c.GetImage(), im.dir)
		if err == nil {
			configs[c.GetName()], err = im.policy.CachedConfig(ctx, c.GetImage(), im.dir)
		}
		if err != nil {
			return nil, nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "actor %s/%s: container %s: %w", w.GetSpace(), w.GetActor(), c.GetName(), err)
		}
		if err := ensureResolvConf(dir, im.nameserver); err != nil {
			return nil, nil, fmt.Errorf("actor %s/%s: container %s: %w", w.GetSpace(), w.GetActor(), c.GetName(), err)
		}
		rootfs[c.GetName()] = dir
	}
	return rootfs, configs, nil
}

// ensureResolvConf gives a root filesystem without /etc/resolv.conf one
// naming nameserver (the gateway: the node's resolver). Without it Go
// and glibc ask 127.0.0.1, which in a sandbox is the sandbox itself; with
// any nameserver, every query goes to the node's resolver, which the
// network redirects them all to (internal/netns). The file goes into the
// image's unpacked tree, not the sandbox's spec (a mount), so a snapshot
// taken before still restores: runsc checks a restore's mounts against
// the checkpoint's. An image's own file is kept.
func ensureResolvConf(rootfs, nameserver string) error {
	if nameserver == "" {
		return nil
	}
	path := filepath.Join(rootfs, "etc", "resolv.conf")
	if _, err := os.Lstat(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	body := "# Written by the torpor node: the image has none. The node answers every DNS query.\nnameserver " + nameserver + "\n"
	if err := atomicfile.Write(path, []byte(body), 0o644); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	return nil
}

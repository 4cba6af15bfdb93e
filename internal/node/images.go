package node

import (
	"context"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/image"
)

// images are the images this node's policy allows, unpacked under dir.
type images struct {
	policy *image.Policy
	dir    string
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
		rootfs[c.GetName()] = dir
	}
	return rootfs, configs, nil
}

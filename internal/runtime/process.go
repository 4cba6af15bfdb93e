package runtime

import (
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
)

// Process is what a container runs: its template settings merged over its
// image's configuration (image.Merge), with the image's user resolved
// against the root filesystem.
type Process struct {
	image.Process
	UID, GID uint32
}

// containerProcess merges c over its image's configuration cfg, whose root
// filesystem is at rootfs. It is a pure function of the template and the
// image, so a restore rebuilds exactly the process that was checkpointed.
func containerProcess(c *torporv1.Container, cfg v1.Config, rootfs string) (Process, error) {
	o := image.Overrides{Command: c.GetCommand(), Args: c.GetArgs(), WorkingDir: c.GetWorkingDir()}
	for _, e := range c.GetEnv() {
		o.Env = append(o.Env, image.EnvVar{Name: e.GetName(), Value: e.GetValue()})
	}
	p, err := image.Merge(cfg, o)
	if err != nil {
		return Process{}, err
	}
	uid, gid, err := image.LookupUser(rootfs, p.User)
	if err != nil {
		return Process{}, fmt.Errorf("image USER: %w", err)
	}
	return Process{Process: p, UID: uid, GID: gid}, nil
}

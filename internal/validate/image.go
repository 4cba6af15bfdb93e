package validate

import (
	"context"
	"fmt"
	"log/slog"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// ImageConfig reads the configuration (ENTRYPOINT, CMD, ...) of the image
// a pinned reference names.
type ImageConfig func(ctx context.Context, pinned string) (*v1.Config, error)

// Commands checks that every container of t has something to run: its own
// command or args, or its image's ENTRYPOINT or CMD. Only images of
// containers that set neither are read. An image this process cannot read
// (a layout only the nodes see, a registry only they may pull from) is not
// held against the template: the node that boots it refuses it for the
// same reason, and the template's golden build says so.
func Commands(ctx context.Context, t *torporv1.Template, config ImageConfig) error {
	for i, c := range t.GetSpec().GetContainers() {
		if len(c.GetCommand())+len(c.GetArgs()) > 0 {
			continue
		}
		cfg, err := config(ctx, c.GetImage())
		if err != nil {
			slog.WarnContext(ctx, "image not readable at apply; its command is checked when the template is built",
				"template", t.GetMetadata().GetSpace()+"/"+t.GetMetadata().GetName(), "container", c.GetName(), "image", c.GetImage(), "err", err)
			continue
		}
		if len(cfg.Entrypoint)+len(cfg.Cmd) == 0 {
			return fieldErr(fmt.Sprintf("spec.containers[%d].command", i), "required: image %s has no ENTRYPOINT or CMD", c.GetImage())
		}
	}
	return nil
}

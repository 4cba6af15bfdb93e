// Command mkimage builds the counter example's OCI image layout without a
// container engine or registry: it compiles the counter statically and
// packs it as /counter in a single-layer image.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor/examples/internal/gobuild"
	"github.com/torpor-dev/torpor/internal/image"
)

const counterPackage = "github.com/torpor-dev/torpor/examples/counter"

func main() {
	out := flag.String("out", "examples/counter/image", "OCI image layout directory to write")
	tag := flag.String("tag", "latest", "tag of the image in the layout")
	flag.Parse()
	if err := build(context.Background(), *out, *tag); err != nil {
		slog.Error("building counter image", "out", *out, "err", err)
		os.Exit(1)
	}
}

func build(ctx context.Context, out, tag string) error {
	tmp, err := os.MkdirTemp("", "counter-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "counter")
	if err := gobuild.Static(ctx, counterPackage, bin); err != nil {
		return err
	}
	digest, err := image.BuildLayout(ctx, out, image.LayoutSpec{
		Files: map[string]string{"/counter": bin},
		Dirs: map[string]fs.FileMode{
			"/data": 0o755,
			"/etc":  0o755,
			"/tmp":  fs.ModeSticky | 0o777,
		},
		Config: v1.Config{
			Entrypoint: []string{"/counter"},
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"PORT=8080",
				"DATA_DIR=/data",
			},
			WorkingDir: "/",
		},
		Tag: tag,
	})
	if err != nil {
		return err
	}
	fmt.Printf("%s:%s@%s\n", out, tag, digest)
	return nil
}

// Command mkimage builds the pod example's OCI image layout without a
// container engine or registry: kv, a Redis-like server, and the
// counter's sidecar, as /kv and /sidecar in a single-layer image with no
// ENTRYPOINT (a template names the program).
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

// programs are the image's files by the package they are built from.
var programs = map[string]string{
	"/kv":      "github.com/torpor-dev/torpor/examples/pod/kv",
	"/sidecar": "github.com/torpor-dev/torpor/examples/pod/sidecar",
}

func main() {
	out := flag.String("out", "examples/pod/image", "OCI image layout directory to write")
	tag := flag.String("tag", "latest", "tag of the image in the layout")
	flag.Parse()
	if err := build(context.Background(), *out, *tag); err != nil {
		slog.Error("building pod image", "out", *out, "err", err)
		os.Exit(1)
	}
}

func build(ctx context.Context, out, tag string) error {
	tmp, err := os.MkdirTemp("", "pod-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	files := map[string]string{}
	for path, pkg := range programs {
		bin := filepath.Join(tmp, filepath.Base(path))
		if err := gobuild.Static(ctx, pkg, bin); err != nil {
			return err
		}
		files[path] = bin
	}
	digest, err := image.BuildLayout(ctx, out, image.LayoutSpec{
		Files: files,
		Dirs: map[string]fs.FileMode{
			"/data": 0o755,
			"/etc":  0o755,
			"/tmp":  fs.ModeSticky | 0o777,
		},
		Config: v1.Config{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
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

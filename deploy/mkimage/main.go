// Command mkimage builds the torpor container image, for every
// architecture make dist built, as an OCI image layout: no container
// engine, no registry. Copy it to a registry with any OCI tool, e.g.
// crane push dist/image REGISTRY/torpor:TAG or skopeo copy oci:dist/image ...
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor/internal/image"
)

func main() {
	dist := flag.String("dist", "dist", "make dist's output: linux-<arch>/torpor and linux-<arch>/runsc")
	out := flag.String("out", "dist/image", "OCI image layout directory to write")
	tag := flag.String("tag", "latest", "tag of the image in the layout")
	arches := flag.String("arch", "amd64,arm64", "architectures, comma-separated")
	flag.Parse()
	digest, err := build(context.Background(), *dist, *out, *tag, strings.Split(*arches, ","))
	if err != nil {
		slog.Error("building the torpor image", "out", *out, "err", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s@%s\n", *out, *tag, digest)
}

// Where things are in the image: runsc next to torpor, which is where the
// node agent looks first; /var/lib/torpor is the data directory of every
// role (the XDG default of a root process would be under /root).
const (
	binDir  = "/usr/local/bin"
	dataDir = "/var/lib/torpor"
)

func build(ctx context.Context, dist, out, tag string, arches []string) (v1.Hash, error) {
	var specs []image.LayoutSpec
	for _, arch := range arches {
		dir := filepath.Join(dist, "linux-"+arch)
		files := map[string]string{}
		for _, bin := range []string{"torpor", "runsc"} {
			host := filepath.Join(dir, bin)
			if _, err := os.Stat(host); err != nil {
				return v1.Hash{}, fmt.Errorf("linux/%s: %w (run make dist)", arch, err)
			}
			files[binDir+"/"+bin] = host
		}
		specs = append(specs, image.LayoutSpec{
			Architecture: arch,
			Files:        files,
			Dirs:         map[string]fs.FileMode{dataDir: 0o700, "/tmp": fs.ModeSticky | 0o777},
			Config: v1.Config{
				Entrypoint: []string{binDir + "/torpor"},
				Cmd:        []string{"--help"},
				Env: []string{
					"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
					"XDG_DATA_HOME=/var/lib",
				},
				WorkingDir: dataDir,
				Labels: map[string]string{
					"org.opencontainers.image.title":    "torpor",
					"org.opencontainers.image.licenses": "Apache-2.0",
					"org.opencontainers.image.version":  tag,
				},
			},
		})
	}
	return image.BuildIndex(ctx, out, tag, specs)
}

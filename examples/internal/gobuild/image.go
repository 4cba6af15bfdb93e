package gobuild

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor/internal/image"
)

// defaultPath is the PATH every example image starts its Env with.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Main is an example's mkimage command: it builds programs (image path →
// Go package) into a single-layer OCI image layout under -out, tagged
// -tag, with the examples' usual directories (/data, /etc, /tmp), config
// (PATH first in Env, WorkingDir /) and prints out:tag@digest.
func Main(name, defaultOut string, programs map[string]string, config v1.Config) {
	out := flag.String("out", defaultOut, "OCI image layout directory to write")
	tag := flag.String("tag", "latest", "tag of the image in the layout")
	flag.Parse()
	digest, err := buildImage(context.Background(), name, *out, *tag, programs, config)
	if err != nil {
		slog.Error("building image", "image", name, "out", *out, "err", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s@%s\n", *out, *tag, digest)
}

func buildImage(ctx context.Context, name, out, tag string, programs map[string]string, config v1.Config) (v1.Hash, error) {
	tmp, err := os.MkdirTemp("", name+"-image-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(tmp)
	files := map[string]string{}
	for path, pkg := range programs {
		bin := filepath.Join(tmp, filepath.Base(path))
		if err := Static(ctx, pkg, bin); err != nil {
			return v1.Hash{}, err
		}
		files[path] = bin
	}
	config.Env = append([]string{defaultPath}, config.Env...)
	config.WorkingDir = "/"
	return image.BuildLayout(ctx, out, image.LayoutSpec{
		Files: files,
		Dirs: map[string]fs.FileMode{
			"/data": 0o755,
			"/etc":  0o755,
			"/tmp":  fs.ModeSticky | 0o777,
		},
		Config: config,
		Tag:    tag,
	})
}

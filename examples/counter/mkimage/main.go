// Command mkimage builds the counter example's OCI image layout without a
// container engine or registry: it compiles the counter statically and
// packs it as /counter in a single-layer image.
package main

import (
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor/examples/internal/gobuild"
)

func main() {
	gobuild.Main("counter", "examples/counter/image",
		map[string]string{"/counter": "github.com/torpor-dev/torpor/examples/counter"},
		v1.Config{Entrypoint: []string{"/counter"}, Env: []string{"PORT=8080", "DATA_DIR=/data"}})
}

// Command mkimage builds the pod example's OCI image layout without a
// container engine or registry: kv, a Redis-like server, and the
// counter's sidecar, as /kv and /sidecar in a single-layer image with no
// ENTRYPOINT (a template names the program).
package main

import (
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor/examples/internal/gobuild"
)

func main() {
	gobuild.Main("pod", "examples/pod/image", map[string]string{
		"/kv":      "github.com/torpor-dev/torpor/examples/pod/kv",
		"/sidecar": "github.com/torpor-dev/torpor/examples/pod/sidecar",
	}, v1.Config{})
}

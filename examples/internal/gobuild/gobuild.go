// Package gobuild compiles the examples' programs for their images.
package gobuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
)

// Static builds the Go package pkg into the binary out, statically and
// reproducibly: a sandbox has no libc, and an unchanged source yields an
// unchanged image digest.
func Static(ctx context.Context, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w", pkg, err)
	}
	return nil
}

package arch

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/torpor-dev/torpor"

// The peer processes (node agent, router, CLI) and the Go client package
// talk to the control plane over its API only: they must not link the
// engine, the store or a SQL driver, or a change there would ship in every
// peer (and in every program that imports the client). The identity
// package is shared by both sides, and the gVisor runtime receives its
// network from the node, so neither may reach across either.
var importRules = []struct {
	pkg string
	// forbidden are import paths, or path prefixes ending in "/...".
	forbidden []string
}{
	{pkg: "internal/node", forbidden: controlPlane},
	{pkg: "internal/router", forbidden: controlPlane},
	{pkg: "internal/cli", forbidden: controlPlane},
	{pkg: "client", forbidden: controlPlane},
	{pkg: "internal/identity", forbidden: controlPlane},
	{pkg: "internal/runtime/gvisor", forbidden: []string{module + "/internal/netns"}},
}

var controlPlane = []string{
	module + "/internal/server",
	module + "/internal/workflow",
	module + "/internal/store",
	"modernc.org/sqlite/...",
	"github.com/jackc/pgx/...",
}

func TestImportRules(t *testing.T) {
	for _, rule := range importRules {
		t.Run(rule.pkg, func(t *testing.T) {
			pkg := module + "/" + rule.pkg
			for _, dep := range deps(t, pkg) {
				for _, f := range rule.forbidden {
					if matches(dep, f) {
						t.Errorf("%s depends on %s, which it must not (go list -deps %s)", pkg, dep, pkg)
					}
				}
			}
		})
	}
}

// matches reports whether import path dep is pattern, or below it when
// pattern ends in "/...".
func matches(dep, pattern string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return dep == prefix || strings.HasPrefix(dep, prefix+"/")
	}
	return dep == pattern
}

// deps is what pkg links: go list -deps, without test files.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	// go test puts its own go first in PATH.
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr)
	}
	list := strings.Fields(string(out))
	if len(list) == 0 {
		t.Fatalf("go list -deps %s listed nothing", pkg)
	}
	return list
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// The binary as the Makefile builds it (-buildvcs=auto overrides a GOFLAGS
// that turns stamping off) says its release version, the commit
// go build stamped and the toolchain, both as `version` and `--version`.
func TestVersionCommand(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "torpor")
	build := exec.Command("go", "build", "-buildvcs=auto", "-ldflags", "-X github.com/torpor-dev/torpor/internal/version.version=v9.8.7-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("torpor version: %v", err)
	}
	fields := map[string]string{}
	for line := range strings.Lines(string(out)) {
		k, v, _ := strings.Cut(line, ":")
		fields[k] = strings.TrimSpace(v)
	}
	if fields["version"] != "v9.8.7-test" || fields["go"] != runtime.Version() {
		t.Errorf("torpor version printed %q, want version v9.8.7-test and go %s", out, runtime.Version())
	}
	// go build stamps the commit in a git checkout, which this test runs in.
	if _, err := os.Stat("../../.git"); err == nil {
		if !regexp.MustCompile(`^[0-9a-f]{40}(-dirty)?$`).MatchString(fields["commit"]) || fields["commit time"] == "unknown" {
			t.Errorf("torpor version printed %q, want the commit and its time", out)
		}
	}

	short, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("torpor --version: %v", err)
	}
	if s := string(short); !strings.HasPrefix(s, "torpor v9.8.7-test (commit ") || !strings.Contains(s, runtime.Version()) || strings.Count(s, "\n") != 1 {
		t.Errorf("torpor --version printed %q", s)
	}
}

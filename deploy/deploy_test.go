// Package deploy_test checks what is shipped to run Torpor on machines:
// make dist's binaries, the container image make image writes, the
// systemd units and the Kubernetes manifests.
package deploy_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// repo is the repository root (the tests run in deploy/).
const repo = ".."

// dist is make image's output for this machine's architecture only (a
// cross build of gVisor takes minutes; make dist builds both), made once
// for all tests of the package.
var dist = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "torpor-dist-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("make", "-C", repo, "image", "DIST="+dir, "DIST_ARCHES=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make image: %w\n%s", err, out)
	}
	return dir, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := dist(); err == nil {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func distDir(t *testing.T) string {
	t.Helper()
	dir, err := dist()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDistVersion: the release binary is static and says the version make
// stamped into it.
func TestDistVersion(t *testing.T) {
	bin := filepath.Join(distDir(t), "linux-amd64", "torpor")
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("torpor version: %v\n%s", err, out)
	}
	describe, err := exec.Command("git", "-C", repo, "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(describe)); !strings.Contains(string(out), want) {
		t.Errorf("torpor version says %q, want the version %q", out, want)
	}
	for _, name := range []string{"torpor", "runsc"} {
		f, err := elf.Open(filepath.Join(distDir(t), "linux-amd64", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s is dynamically linked (%s)", name, p.Type)
			}
		}
		if f.Machine != elf.EM_X86_64 {
			t.Errorf("%s is for %s, want x86-64", name, f.Machine)
		}
		f.Close()
	}
}

// TestImageLayout: make image writes an OCI layout that passes
// go-containerregistry's validation (every blob read back against its
// digest and size), with an index of one image per architecture whose
// entrypoint is torpor, runsc beside it.
func TestImageLayout(t *testing.T) {
	idx, err := layout.ImageIndexFromPath(filepath.Join(distDir(t), "image"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] == "" {
		t.Fatalf("index.json holds %+v, want one tagged image index", top.Manifests)
	}
	multi, err := idx.ImageIndex(top.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(multi); err != nil {
		t.Fatalf("OCI validation: %v", err)
	}
	im, err := multi.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.OS != "linux" || im.Manifests[0].Platform.Architecture != "amd64" {
		t.Fatalf("platforms %+v, want linux/amd64 (DIST_ARCHES=amd64)", im.Manifests)
	}
	img, err := multi.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/torpor"}) {
		t.Errorf("config %s/%s entrypoint %q, want linux/amd64 /usr/local/bin/torpor", cf.OS, cf.Architecture, cf.Config.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	modes := map[string]int64{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		modes[hdr.Name] = hdr.Mode
	}
	for _, f := range []string{"usr/local/bin/torpor", "usr/local/bin/runsc"} {
		if mode, ok := modes[f]; !ok || mode&0o111 == 0 {
			t.Errorf("layer: %s missing or not executable (mode %o, present %v)", f, mode, ok)
		}
	}
}

// flagsOf returns the long flags `torpor <role> --help` lists.
func flagsOf(t *testing.T, role string) map[string]bool {
	t.Helper()
	out, err := exec.Command(filepath.Join(distDir(t), "linux-amd64", "torpor"), role, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("torpor %s --help: %v\n%s", role, err, out)
	}
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		flags[m[1]] = true
	}
	if len(flags) < 5 {
		t.Fatalf("torpor %s --help lists %d flags:\n%s", role, len(flags), out)
	}
	return flags
}

// checkArgs checks that args are flags of `torpor role`.
func checkArgs(t *testing.T, where, role string, args []string, known map[string]bool) {
	t.Helper()
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !known[name] {
			t.Errorf("%s: torpor %s has no flag --%s", where, role, name)
		}
	}
}

// TestSystemdUnits: each unit runs its role with flags that role has,
// from its command line and its example environment file.
func TestSystemdUnits(t *testing.T) {
	for _, role := range []string{"server", "node", "router"} {
		t.Run(role, func(t *testing.T) {
			unit := readUnit(t, filepath.Join("systemd", "torpor-"+role+".service"))
			for _, key := range []string{"Unit.Description", "Service.ExecStart", "Service.EnvironmentFile", "Install.WantedBy"} {
				if unit[key] == "" {
					t.Errorf("no %s", key)
				}
			}
			exec := strings.Fields(unit["Service.ExecStart"])
			if len(exec) < 2 || exec[0] != "/usr/local/bin/torpor" || exec[1] != role {
				t.Fatalf("ExecStart %q, want /usr/local/bin/torpor %s ...", unit["Service.ExecStart"], role)
			}
			known := flagsOf(t, role)
			checkArgs(t, "ExecStart", role, exec[2:], known)
			envVar := "TORPOR_" + strings.ToUpper(role) + "_FLAGS"
			if !slices.Contains(exec, "$"+envVar) {
				t.Errorf("ExecStart does not pass $%s", envVar)
			}
			env := readUnit(t, filepath.Join("systemd", role+".env"))
			if env[envVar] == "" {
				t.Fatalf("%s.env sets no %s", role, envVar)
			}
			checkArgs(t, role+".env", role, strings.Fields(env[envVar]), known)
			if role == "node" && unit["Service.KillMode"] != "process" {
				t.Errorf("node: KillMode %q, want process (a stop keeps running actors' sandboxes)", unit["Service.KillMode"])
			}
		})
	}
}

// readUnit reads an INI-style file as Section.Key (or Key outside any
// section) → value; a repeated key keeps its last value.
func readUnit(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, section := map[string]string{}, ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]") + "."
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: %q is no key=value", path, line)
			}
			out[section+k] = v
		}
	}
	return out
}

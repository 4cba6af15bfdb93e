package e2e

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// rootfsDir copies this machine's dash (as /bin/sh), cat and sleep with
// the shared libraries they load into a root filesystem directory, as a
// user's build or an unpacked distribution would have it.
func rootfsDir(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	place := func(guest, host string) {
		t.Helper()
		dst := filepath.Join(root, guest)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		src, err := os.Open(host)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		if _, err := io.Copy(out, src); err != nil {
			t.Fatal(err)
		}
	}
	for guest, name := range map[string]string{"/bin/sh": "dash", "/bin/cat": "cat", "/bin/sleep": "sleep"} {
		host, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		place(guest, host)
		out, err := exec.Command("ldd", host).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", host, err)
		}
		for _, m := range regexp.MustCompile(`(?m)(/\S+) \(0x`).FindAllStringSubmatch(string(out), -1) {
			place(m[1], m[1])
		}
	}
	for _, d := range []string{"srv/app", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestImageFromRootfsDirectory: `torpor image build` makes an image of a
// root filesystem directory with an entrypoint, environment and working
// directory, no container engine involved; a template naming only that
// image runs it on gVisor as configured.
func TestImageFromRootfsDirectory(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	layout := filepath.Join(t.TempDir(), "app-image")
	build := exec.Command(torporBinary(t), "image", "build", rootfsDir(t), "-o", layout,
		"--entrypoint", `["/bin/sh", "-c", "echo \"$GREETING from $(pwd)\" > /tmp/out; exec sleep 1000000"]`,
		"--env", "GREETING=hello", "--workdir", "/srv/app")
	out, err := build.Output()
	if err != nil {
		t.Fatalf("torpor image build: %v", err)
	}
	pinned := strings.TrimSpace(string(out))
	if !strings.HasPrefix(pinned, "oci:"+layout+"@sha256:") {
		t.Fatalf("torpor image build printed %q, want the pinned reference of %s", pinned, layout)
	}
	c.applyTemplate(&torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "from-rootfs"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers: []*torporv1.Container{{Name: "app", Image: pinned,
			ReadinessProbe: &torporv1.Probe{Exec: &torporv1.ExecAction{Command: []string{"/bin/cat", "/tmp/out"}}, TimeoutSeconds: 30}}},
	}})
	c.createActor("r1", "from-rootfs")
	c.mustResume("r1")
	token := c.apiToken("default")
	got, err := c.torporAs(token, "actor", "exec", "r1", "--", "/bin/cat", "/tmp/out").Output()
	if err != nil {
		t.Fatalf("exec cat /tmp/out: %v", err)
	}
	if string(got) != "hello from /srv/app\n" {
		t.Errorf("the image's entrypoint wrote %q, want %q: its env and workdir as built", got, "hello from /srv/app\n")
	}
}

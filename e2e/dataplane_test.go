package e2e

import (
	"bufio"
	"errors"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/protobuf/encoding/protojson"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/image"
)

// buildShellImage packs this machine's dash (as /bin/sh) and a few
// coreutils with the shared libraries they load into an OCI layout under
// dir, and returns the pinned reference.
func buildShellImage(t *testing.T, dir string) string {
	t.Helper()
	files := map[string]string{}
	for guest, name := range map[string]string{"/bin/sh": "dash", "/bin/cat": "cat", "/bin/false": "false", "/bin/sleep": "sleep"} {
		host, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		files[guest] = host
		out, err := exec.Command("ldd", host).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", host, err)
		}
		for _, m := range regexp.MustCompile(`(?m)(/\S+) \(0x`).FindAllStringSubmatch(string(out), -1) {
			files[m[1]] = m[1]
		}
	}
	layout := filepath.Join(dir, "shell-image")
	digest, err := image.BuildLayout(t.Context(), layout, image.LayoutSpec{
		Files:  files,
		Dirs:   map[string]fs.FileMode{"/data": 0o755, "/tmp": fs.ModeSticky | 0o777},
		Config: v1.Config{Entrypoint: []string{"/bin/sh"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return image.LayoutScheme + layout + "@" + digest.String()
}

// lineWriter writes "line N" every 200 ms to its output and to
// /data/lines, from 1 on, or on from the last line a restore kept.
func lineWriter(pinned string) *torporv1.Template {
	script := `i=$(cat /data/lines 2>/dev/null | while read -r _ n; do echo "$n"; done | tail -n 1 2>/dev/null); i=${i:-0}
while :; do i=$((i+1)); echo "line $i"; echo "line $i" >> /data/lines; sleep 0.2; done`
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "lines"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers: []*torporv1.Container{{
			Name: "writer", Image: pinned, Command: []string{"/bin/sh", "-c", script},
			Mounts: []*torporv1.Mount{{Volume: "data", Path: "/data"}},
		}},
		Volumes: []*torporv1.Volume{{Name: "data", Kind: torporv1.VolumeKind_VOLUME_KIND_DURABLE}},
	}}
}

// TestExecAndStats: `torpor actor exec` runs commands in a real gVisor
// sandbox with the command's exit status, interactively on a terminal
// too, resuming a suspended actor; `torpor actor stats` shows its use and
// snapshots; a token of another space is refused both.
func TestExecAndStats(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	c.applyTemplate(lineWriter(buildShellImage(t, t.TempDir())))
	c.createActor("c1", "lines")
	token := c.apiToken("default")
	c.mustResume("c1")

	var lines string
	c.waitFor("lines in /data/lines", func() bool {
		out, err := c.torporAs(token, "actor", "exec", "c1", "--", "cat", "/data/lines").Output()
		lines = string(out)
		return err == nil && strings.Contains(lines, "line 2\n")
	})
	if !strings.HasPrefix(lines, "line 1\nline 2\n") {
		t.Fatalf("exec cat /data/lines printed %q", lines)
	}

	err := c.torporAs(token, "actor", "exec", "c1", "--", "false").Run()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exec false: %v, want exit status 1", err)
	}
	out, err := c.torporAs(token, "actor", "exec", "c1", "-i", "--", "cat").Output()
	if err != nil || len(out) != 0 {
		t.Fatalf("exec -i cat with no input: %v, %q", err, out)
	}
	cmd := c.torporAs(token, "actor", "exec", "c1", "-i", "--", "sh", "-c", "cat; echo; echo done >&2")
	cmd.Stdin = strings.NewReader("piped in")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil || string(out) != "piped in\n" || stderr.String() != "done\n" {
		t.Fatalf("exec -i: %v, stdout %q, stderr %q", err, out, stderr.String())
	}

	interactive(t, c.torporAs(token, "actor", "exec", "c1", "-it", "--", "sh"))

	var st torporv1.ActorStats
	statsOf := func() {
		t.Helper()
		out, err := c.torporAs(token, "actor", "stats", "c1", "-o", "json").Output()
		if err != nil {
			t.Fatalf("stats: %v", err)
		}
		if err := protojson.Unmarshal(out, &st); err != nil {
			t.Fatalf("stats -o json: %v: %s", err, out)
		}
	}
	statsOf()
	if st.GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING || st.GetMemoryBytes() <= 0 || st.GetCpuSeconds() <= 0 || st.GetStarted() == nil {
		t.Fatalf("stats of a running actor: %v", &st)
	}
	c.suspend("c1")
	statsOf()
	if st.GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED || st.GetSnapshots() < 1 || st.GetLatestSnapshotBytes() <= 0 || st.GetSnapshotsBytes() < st.GetLatestSnapshotBytes() || st.GetMemoryBytes() != 0 {
		t.Fatalf("stats of a suspended actor: %v", &st)
	}
	if got := c.actor("c1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("stats resumed the actor: %s", got)
	}
	// Exec on a suspended actor resumes it; the lines it wrote survived.
	out, err = c.torporAs(token, "actor", "exec", "c1", "--", "cat", "/data/lines").Output()
	if err != nil || !strings.HasPrefix(string(out), lines) {
		t.Fatalf("exec in a suspended actor: %v, %q", err, out)
	}
	if got := c.actor("c1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_RUNNING {
		t.Fatalf("after exec in a suspended actor: %s, want RUNNING", got)
	}

	other := c.apiToken("other")
	for _, args := range [][]string{
		{"actor", "exec", "c1", "--", "cat", "/data/lines"},
		{"actor", "exec", "c1", "-it", "--", "sh"},
		{"actor", "logs", "c1"},
		{"actor", "stats", "c1"},
	} {
		out, err := c.torporAs(other, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "permission_denied") {
			t.Errorf("%s with a token of another space: %v\n%s\nwant permission_denied", strings.Join(args, " "), err, out)
		}
	}
}

// interactive runs cmd (exec -it sh) on a pseudo-terminal, types two
// commands into the shell and expects the second's status.
func interactive(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	tty, err := pty.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	output := make(chan string, 100)
	go func() {
		defer close(output)
		r := bufio.NewReader(tty)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				output <- line
			}
			if err != nil {
				return
			}
		}
	}()
	// The terminal echoes what is typed ("echo $((6*7))"); the result
	// (42) alone proves the shell ran it.
	if _, err := tty.WriteString("echo $((6*7))\n"); err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	deadline := time.After(time.Minute)
	for found := false; !found; {
		select {
		case line, ok := <-output:
			seen.WriteString(line)
			if !ok {
				t.Fatalf("exec -it sh ended early:\n%s", seen.String())
			}
			// After the prompt ("# 42"), which the shell prints before
			// it reads the line typed ahead.
			found = strings.HasSuffix(strings.TrimSpace(line), "42") && !strings.Contains(line, "*")
		case <-deadline:
			t.Fatalf("exec -it sh: no answer:\n%s", seen.String())
		}
	}
	if _, err := tty.WriteString("exit 3\n"); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exec -it sh, exit 3: %v\n%s", err, seen.String())
	}
}

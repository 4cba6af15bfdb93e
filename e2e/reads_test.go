package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// dier waits until told to die (/tmp/die exists), then writes its last
// words to standard error and exits 3.
func dier(pinned string) *torporv1.Template {
	script := `while [ ! -e /tmp/die ]; do sleep 0.1; done; echo "fatal: told to die" >&2; exit 3`
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "dier"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers:   []*torporv1.Container{{Name: "app", Image: pinned, Command: []string{"/bin/sh", "-c", script}}},
		// It stays CRASHED, for its log to be read there.
		RestartPolicy: torporv1.RestartPolicy_RESTART_POLICY_NEVER,
	}}
}

// sleeper sleeps: an idle actor.
func sleeper(pinned string) *torporv1.Template {
	return &torporv1.Template{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "sleeper"}, Spec: &torporv1.TemplateSpec{
		SandboxClass: "gvisor",
		Containers:   []*torporv1.Container{{Name: "app", Image: pinned, Command: []string{"/bin/sleep", "1000000"}}},
	}}
}

// followed is the output of a `logs -f` running in the background.
type followed struct {
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func (f *followed) read(r io.Reader) {
	defer close(f.done)
	s := bufio.NewScanner(r)
	for s.Scan() {
		f.mu.Lock()
		f.lines = append(f.lines, s.Text())
		f.mu.Unlock()
	}
}

func (f *followed) text() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.lines, "\n")
}

// TestReadsNeverWake: logs, stats, get, describe and events of a
// suspended actor and of a crashed one read what the store, the node and
// the snapshot hold, and leave the actor as it was (DESIGN invariant
// 12); the crash's last output is in its log; logs -f follows across a
// suspend and a resume; --tail counts lines and -o json carries text.
func TestReadsNeverWake(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite", workersPerNode: 2})
	image := buildShellImage(t, t.TempDir())
	c.applyTemplate(lineWriter(image))
	c.applyTemplate(dier(image))
	token := c.apiToken("default")
	cli := func(args ...string) string {
		t.Helper()
		out, err := c.torporAs(token, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("torpor %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// unchanged fails when name's state or the time of its last change
	// differs from before.
	unchanged := func(name, what string, before *torporv1.Actor) {
		t.Helper()
		after := c.actor(name)
		if after.GetStatus().GetState() != before.GetStatus().GetState() || !after.GetStatus().GetStateTime().AsTime().Equal(before.GetStatus().GetStateTime().AsTime()) {
			t.Fatalf("%s changed %s from %s (%s) to %s (%s)", what, name, before.GetStatus().GetState(), before.GetStatus().GetStateTime().AsTime(),
				after.GetStatus().GetState(), after.GetStatus().GetStateTime().AsTime())
		}
	}
	reads := func(name string) {
		t.Helper()
		before := c.actor(name)
		for _, args := range [][]string{
			{"actor", "logs", name},
			{"actor", "logs", name, "--tail", "2", "-o", "json"},
			{"actor", "stats", name},
			{"actor", "get", name},
			{"actor", "describe", name},
			{"actor", "events", name},
		} {
			cli(args...)
			unchanged(name, strings.Join(args[:2], " "), before)
		}
	}

	// A suspended actor.
	c.createActor("r1", "lines")
	c.mustResume("r1")
	c.waitFor("lines in r1's log", func() bool { return strings.Count(cli("actor", "logs", "r1", "-c", "writer"), " writer line ") >= 5 })
	c.suspend("r1")
	reads("r1")
	all := cli("actor", "logs", "r1")
	lines := strings.Split(strings.TrimSpace(all), "\n")
	if !strings.Contains(lines[len(lines)-1], " -- suspended") || strings.Count(all, " writer line ") < 5 {
		t.Fatalf("logs of suspended r1:\n%s\nwant its lines, then the suspend", all)
	}
	if tail := strings.Split(strings.TrimSpace(cli("actor", "logs", "r1", "--tail", "3")), "\n"); len(tail) != 3 || tail[2] != lines[len(lines)-1] || tail[0] != lines[len(lines)-3] {
		t.Fatalf("logs --tail 3: %q, want the last 3 of\n%s", tail, all)
	}
	var rec struct{ Time, Container, Stream, Text string }
	js := strings.Split(strings.TrimSpace(cli("actor", "logs", "r1", "-c", "writer", "--tail", "1", "-o", "json")), "\n")
	if err := json.Unmarshal([]byte(js[0]), &rec); err != nil || len(js) != 1 || rec.Container != "writer" || rec.Stream != "stdout" || !strings.HasPrefix(rec.Text, "line ") {
		t.Fatalf("logs -o json: %q (%v), want one record whose text is a line", js, err)
	}

	// A crashed actor: its node keeps its log, with its last words.
	c.createActor("d1", "dier")
	c.mustResume("d1")
	cli("actor", "exec", "d1", "--", "/bin/sh", "-c", ": > /tmp/die")
	c.waitFor("d1's last words", func() bool { return strings.Contains(cli("actor", "logs", "d1"), " app fatal: told to die") })
	// The exit is noticed by itself, or at the latest by a suspend,
	// which finds the workload gone.
	c.waitFor("d1 crashed", func() bool {
		if c.actor("d1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_RUNNING {
			c.actors.SuspendActor(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "d1"}))
		}
		return c.actor("d1").GetStatus().GetState() == torporv1.ActorState_ACTOR_STATE_CRASHED
	})
	reads("d1")
	if out := cli("actor", "logs", "d1", "-c", "app"); !strings.Contains(out, " app fatal: told to die") {
		t.Fatalf("logs of crashed d1:\n%s\nwant its last words", out)
	}
	if out := cli("actor", "logs", "d1", "--tail", "2"); !strings.Contains(out, " app fatal: told to die") {
		t.Fatalf("logs --tail 2 of crashed d1:\n%s\nwant its last words", out)
	}
	// describe ends with where the actor is reached and its latest
	// events, the crash among them, in UTC.
	if out := cli("actor", "describe", "d1"); !strings.Contains(out, "\nURL:  http://d1.default.") || !regexp.MustCompile(`(?m)^  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ .*CRASHED`).MatchString(out) {
		t.Fatalf("describe of crashed d1:\n%s\nwant its URL and an event of the crash in UTC", out)
	}

	// A follow across two resumes and suspends.
	// r1 is suspended: the follow prints its log so far and waits.
	follow := c.torporAs(token, "actor", "logs", "r1", "-f", "-c", "writer")
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	f := &followed{done: make(chan struct{})}
	go f.read(stdout)
	defer func() {
		follow.Process.Kill()
		follow.Wait()
	}()
	last := func() int {
		n := 0
		for _, l := range strings.Split(f.text(), "\n") {
			if _, num, ok := strings.Cut(l, " writer line "); ok {
				fmt.Sscan(num, &n)
			}
		}
		return n
	}
	c.waitFor("the log so far", func() bool { return last() > 0 })
	if got := c.actor("r1").GetStatus().GetState(); got != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Fatalf("logs -f of a suspended actor made it %s", got)
	}
	for round := range 2 {
		before := last()
		c.mustResume("r1")
		c.waitFor(fmt.Sprintf("lines after resume %d", round+1), func() bool { return last() >= before+3 })
		c.suspend("r1")
	}
	select {
	case <-f.done:
		t.Fatalf("logs -f ended at a suspend:\n%s", f.text())
	case <-time.After(2 * followPollWait):
	}
	// Every line once, in order, over both runs.
	n := 0
	for _, l := range strings.Split(f.text(), "\n") {
		var num int
		if _, rest, ok := strings.Cut(l, " writer line "); ok {
			fmt.Sscan(rest, &num)
			if n != 0 && num != n+1 {
				t.Fatalf("line %d after line %d:\n%s", num, n, f.text())
			}
			n = num
		}
	}
}

// TestIdleActorCPU: the CPU time `actor stats` and the node's metric
// report for an idle actor is its sandbox's, less than it has been up
// (not the host's).
func TestIdleActorCPU(t *testing.T) {
	c := newCluster(t, clusterOptions{backend: "sqlite"})
	c.applyTemplate(sleeper(buildShellImage(t, t.TempDir())))
	c.createActor("s1", "sleeper")
	c.mustResume("s1")
	// Up long enough that a sandbox's few milliseconds cannot pass it.
	time.Sleep(3 * time.Second)
	resp, err := c.actors.GetActorStats(c.ctx, connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "s1"}))
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Msg
	up := time.Since(st.GetStarted().AsTime())
	cpu := time.Duration(st.GetCpuSeconds() * float64(time.Second))
	if st.GetStarted() == nil || cpu <= 0 || cpu >= up {
		t.Fatalf("stats of idle s1: cpu %v, up %v (started %v); want some CPU, less than its uptime", cpu, up, st.GetStarted())
	}
	families, err := c.nodes[0].metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var metric float64
	for _, f := range families {
		if f.GetName() == "torpor_node_actor_cpu_seconds_total" {
			for _, m := range f.GetMetric() {
				metric += m.GetCounter().GetValue()
			}
		}
	}
	if up := time.Since(st.GetStarted().AsTime()).Seconds(); metric <= 0 || metric >= up {
		t.Fatalf("torpor_node_actor_cpu_seconds_total of idle s1: %v, up %.1fs; want some, less than its uptime", metric, up)
	}
	t.Logf("idle s1: %v CPU in %v", cpu, up.Round(time.Millisecond))
}

// followPollWait is longer than a follow takes to notice the actor's
// next state (the server reads it twice a second).
const followPollWait = 2 * time.Second

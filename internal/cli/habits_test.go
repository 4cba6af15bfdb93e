package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/testkit"
)

// actorsOn starts a fake API with template counter (READY) and the named
// actors, created through the command line.
func actorsOn(t *testing.T, names ...string) (*fakeAPI, string) {
	t.Helper()
	isolate(t)
	fake, url := startFakeAPI(t)
	fake.templates.put(&torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "counter"},
		Status:   &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY, Revision: 1, LatestRevision: 1},
	})
	for _, name := range names {
		ok(t, url, "actor", "create", name, "--template", "counter")
	}
	return fake, url
}

// TestLabels: -l sets labels on create and selects by them on list, in
// every form of the selector; -o wide shows them.
func TestLabels(t *testing.T) {
	fake, url := actorsOn(t)
	ok(t, url, "actor", "create", "web", "--template", "counter", "-l", "team=a,tier=web")
	ok(t, url, "actor", "create", "db", "--template", "counter", "--labels", "team=b")
	ok(t, url, "actor", "create", "bare", "--template", "counter")
	if a, err := fake.actors.get("default", "web"); err != nil || a.GetMetadata().GetLabels()["tier"] != "web" || a.GetMetadata().GetLabels()["team"] != "a" {
		t.Fatalf("stored labels %v (%v)", a.GetMetadata().GetLabels(), err)
	}
	for selector, want := range map[string]string{
		"team=a":       "actor/web\n",
		"team==b":      "actor/db\n",
		"team!=a":      "actor/bare\nactor/db\n",
		"tier":         "actor/web\n",
		"!tier":        "actor/bare\nactor/db\n",
		"team,!tier":   "actor/db\n",
		"team=a,tier=": "",
	} {
		equalText(t, "list -l "+selector, ok(t, url, "actor", "list", "-l", selector, "-o", "name"), want)
	}
	if msg := fails(t, url, "actor", "list", "-l", "=x"); !strings.Contains(msg, "no label key") {
		t.Errorf("bad selector: %q", msg)
	}
	wide := ok(t, url, "actor", "list", "-o", "wide", "-l", "team")
	if lines := strings.Split(strings.TrimSpace(wide), "\n"); len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "NAME TEMPLATE STATE WORKER SNAPSHOT SELECTOR LABELS AGE" || !strings.Contains(lines[2], "team=a,tier=web") {
		t.Errorf("-o wide:\n%s", wide)
	}
}

// TestOutputNameAndEnumNames: -o name prints KIND/NAME lines; JSON and
// YAML name enum values as tables do.
func TestOutputNameAndEnumNames(t *testing.T) {
	_, url := actorsOn(t, "a1", "a2")
	equalText(t, "-o name", ok(t, url, "actor", "list", "-o", "name"), "actor/a1\nactor/a2\n")
	equalText(t, "get -o name", ok(t, url, "actor", "get", "a2", "-o", "name"), "actor/a2\n")
	for _, format := range []string{formatJSON, formatYAML} {
		out := ok(t, url, "actor", "get", "a1", "-o", format)
		if !strings.Contains(out, "SUSPENDED") || strings.Contains(out, "ACTOR_STATE_") {
			t.Errorf("-o %s names the state as the API does:\n%s", format, out)
		}
		if out := ok(t, url, "template", "get", "counter", "-o", format); !strings.Contains(out, "READY") || strings.Contains(out, "TEMPLATE_PHASE_") {
			t.Errorf("-o %s names the phase as the API does:\n%s", format, out)
		}
	}
}

// TestSeveralNames: the actor verbs take several names; a delete goes on
// past a name that fails, reporting each, and fails at the end.
func TestSeveralNames(t *testing.T) {
	fake, url := actorsOn(t, "a", "b", "c")
	equalText(t, "resume a b", ok(t, url, "actor", "resume", "a", "b"), "actor/a resumed\nactor/b resumed\n")
	equalText(t, "suspend a b", ok(t, url, "actor", "suspend", "a", "b"), "actor/a suspended\nactor/b suspended\n")
	equalText(t, "pause c", ok(t, url, "actor", "resume", "c"), "actor/c resumed\n")
	r := torpor(t, url, "actor", "delete", "a", "missing", "c")
	equalText(t, "delete stdout", r.stdout, "actor/a deleted\nactor/c deleted\n")
	equalText(t, "delete stderr", r.stderr, "Error: actor/missing: not_found: actor default/missing not found\nError: 1 of 3 actors failed\n")
	if r.code != 1 || fake.actors.len() != 1 {
		t.Errorf("exit %d, %d actors left (want 1, b)", r.code, fake.actors.len())
	}
	if r := torpor(t, url, "template", "delete", "x", "counter", "y"); r.code != 1 || r.stdout != "template/counter deleted\n" ||
		!strings.Contains(r.stderr, "template/x: not_found") || !strings.Contains(r.stderr, "template/y: not_found") || !strings.Contains(r.stderr, "2 of 3 templates failed") {
		t.Errorf("template delete x counter y: %+v", r)
	}
}

// TestAlreadyRunning: resuming a running actor (or suspending a suspended
// one) says so rather than claiming a change.
func TestAlreadyRunning(t *testing.T) {
	_, url := actorsOn(t, "a")
	equalText(t, "suspend a suspended actor", ok(t, url, "actor", "suspend", "a"), "actor/a already suspended\n")
	equalText(t, "resume", ok(t, url, "actor", "resume", "a"), "actor/a resumed\n")
	equalText(t, "resume again", ok(t, url, "actor", "resume", "a"), "actor/a already running\n")
}

// TestWait: --wait takes no value and --timeout bounds it; "--wait 2m"
// is refused, naming --timeout, before anything is done; under --wait a
// resume refused for lack of a worker is tried again.
func TestWait(t *testing.T) {
	fake, url := actorsOn(t, "a")
	for _, args := range [][]string{
		{"actor", "resume", "a", "--wait", "2m"},
		{"actor", "resume", "--wait", "2m"},
		{"template", "apply", "-f", "t.yaml", "--wait", "2m"},
		{"actor", "resume", "a", "--wait=2m"},
	} {
		if msg := fails(t, url, args...); !strings.Contains(msg, "--timeout 2m") {
			t.Errorf("%v: %q, want it to name --timeout 2m", args, msg)
		}
	}
	if a, _ := fake.actors.get("default", "a"); a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_SUSPENDED {
		t.Errorf("a refused command changed the actor: %v", a.GetStatus().GetState())
	}

	fake.noFreeWorker = 2
	if msg := fails(t, url, "actor", "resume", "a"); !strings.Contains(msg, "resource_exhausted") {
		t.Errorf("resume without --wait while no worker is free: %q", msg)
	}
	equalText(t, "resume --wait", ok(t, url, "actor", "resume", "a", "--wait", "--timeout", "1m"), "actor/a resumed\n")
	if len(fake.resumes) != 3 {
		t.Errorf("%d resume calls, want 1 refused, 1 refused under --wait, 1 done", len(fake.resumes))
	}
	fake.noFreeWorker = 1000
	ok(t, url, "actor", "suspend", "a")
	if msg := fails(t, url, "actor", "resume", "a", "--wait", "--timeout", "1s"); !strings.Contains(msg, "not done within --timeout 1s") {
		t.Errorf("resume --wait past its timeout: %q", msg)
	}
}

// watching runs a watching command until stop is called, which returns
// its exit code.
func watching(t *testing.T, url string, args ...string) (stdout, stderr *testkit.SyncBuffer, waitFor func(string), stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	root := NewRoot()
	stdout, stderr = &testkit.SyncBuffer{}, &testkit.SyncBuffer{}
	root.SetOut(stdout)
	root.SetErr(stderr)
	done := make(chan int, 1)
	go func() { done <- Execute(ctx, root, append([]string{"--server", url}, args...)) }()
	waitFor = func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(stdout.String(), want) {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("%v: no %q in the output after 30s:\n%s\nstderr: %s", args, want, stdout.String(), stderr.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Cleanup(cancel)
	return stdout, stderr, waitFor, func() int { cancel(); return <-done }
}

// TestWatch: list -w prints the list, then each change as it happens, and
// deletions on stderr; events -w prints new events.
func TestWatch(t *testing.T) {
	fake, url := actorsOn(t, "a", "b")
	stdout, stderr, waitFor, stop := watching(t, url, "actor", "list", "-w")
	waitFor("b      counter@1   SUSPENDED")
	if _, err := fake.ResumeActor(context.Background(), connect.NewRequest(&torporv1.ResumeActorRequest{Space: "default", Name: "b"})); err != nil {
		t.Fatal(err)
	}
	fake.actors.update("default", "b", func(a *torporv1.Actor) error { a.Metadata.Version++; return nil })
	waitFor("RUNNING")
	if _, err := fake.DeleteActor(context.Background(), connect.NewRequest(&torporv1.DeleteRequest{Space: "default", Name: "a"})); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), "actor/a deleted"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no deletion reported; stderr %q", stderr.String())
		}
	}
	if code := stop(); code != 0 {
		t.Errorf("watch ended with exit %d", code)
	}
	if lines := strings.Split(strings.TrimSpace(stdout.String()), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[3], "b ") || !strings.Contains(lines[3], "RUNNING") {
		t.Errorf("watch output, want the list and b's change alone:\n%s", stdout.String())
	}

	fake.events = []*torporv1.ActorEvent{{Time: timestamppb.Now(), FromState: torporv1.ActorState_ACTOR_STATE_SUSPENDED, ToState: torporv1.ActorState_ACTOR_STATE_RESUMING, Reason: "first"}}
	_, _, waitFor, stop = watching(t, url, "actor", "events", "b", "-w")
	waitFor("first")
	fake.mu.Lock()
	fake.events = append(fake.events, &torporv1.ActorEvent{Time: timestamppb.Now(), FromState: torporv1.ActorState_ACTOR_STATE_RESUMING, ToState: torporv1.ActorState_ACTOR_STATE_RUNNING, Reason: "second"})
	fake.mu.Unlock()
	waitFor("second")
	stop()
}

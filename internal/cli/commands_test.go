package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/validate"
)

type result struct {
	stdout, stderr string
	code           int
}

// isolate keeps a test away from the user's TORPOR_SERVER and config file.
func isolate(t *testing.T) {
	t.Helper()
	t.Setenv("TORPOR_SERVER", "")
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
}

// torpor runs the command line as a user would, against server.
func torpor(t *testing.T, server string, args ...string) result {
	t.Helper()
	return torporWithInput(t, server, "", args...)
}

func torporWithInput(t *testing.T, server, stdin string, args ...string) result {
	t.Helper()
	root := NewRoot()
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetIn(strings.NewReader(stdin))
	if server != "" {
		args = append([]string{"--server", server}, args...)
	}
	code := Execute(context.Background(), root, args)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// ok runs a command that must succeed and returns its stdout.
func ok(t *testing.T, server string, args ...string) string {
	t.Helper()
	r := torpor(t, server, args...)
	if r.code != 0 {
		t.Fatalf("torpor %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// fails runs a command that must fail and returns its stderr.
func fails(t *testing.T, server string, args ...string) string {
	t.Helper()
	r := torpor(t, server, args...)
	if r.code != 1 {
		t.Fatalf("torpor %s: exit %d, want 1 (stdout %q)", strings.Join(args, " "), r.code, r.stdout)
	}
	return r.stderr
}

func equalText(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got:\n%s\nwant:\n%s", what, got, want)
	}
}

// decodeAs parses -o json or -o yaml output into msg.
func decodeAs(t *testing.T, format, out string, msg proto.Message) {
	t.Helper()
	data := []byte(out)
	if format == formatYAML {
		var err error
		if data, err = yaml.YAMLToJSON(data); err != nil {
			t.Fatalf("output is not YAML: %v\n%s", err, out)
		}
	}
	// The output names enum values as the tables do; protojson wants
	// their full names.
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if obj, ok := v.(map[string]any); ok { // a template file's header
		delete(obj, "apiVersion")
		delete(obj, "kind")
	}
	renameEnums(v, msg.ProtoReflect().Descriptor(), func(ed protoreflect.EnumDescriptor, name string) string {
		if strings.HasPrefix(name, enum.Prefix(ed)) {
			t.Errorf("output has the enum value %s, want its short name", name)
		}
		return enum.Prefix(ed) + name
	})
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(data, msg); err != nil {
		t.Fatalf("output is not a %s: %v\n%s", msg.ProtoReflect().Descriptor().Name(), err, out)
	}
}

func TestSpaceCommands(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)

	equalText(t, "create", ok(t, url, "space", "create", "team-a"), "space/team-a created\n")
	ok(t, url, "space", "create", "team-b")
	equalText(t, "list", ok(t, url, "space", "list"), "NAME     AGE\nteam-a   3h\nteam-b   3h\n")
	equalText(t, "get", ok(t, url, "space", "get", "team-b"), "NAME     AGE\nteam-b   3h\n")

	stored, err := fake.spaces.get("", "team-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{formatJSON, formatYAML} {
		t.Run(format, func(t *testing.T) {
			out := ok(t, url, "space", "get", "team-a", "-o", format)
			if !strings.Contains(out, "\n  ") {
				t.Errorf("output is not multi-line and indented:\n%s", out)
			}
			var got torporv1.Space
			decodeAs(t, format, out, &got)
			if !proto.Equal(&got, stored) {
				t.Errorf("got %v, want %v", &got, stored)
			}
			for _, args := range [][]string{{"space", "list"}, {"space", "get", "team-a", "team-b"}} {
				var list struct {
					Items []map[string]any `json:"items"`
				}
				if err := yaml.Unmarshal([]byte(ok(t, url, append(args, "-o", format)...)), &list); err != nil || len(list.Items) != 2 {
					t.Errorf("%s -o %s: %d items, err %v", strings.Join(args, " "), format, len(list.Items), err)
				}
			}
		})
	}

	equalText(t, "delete", ok(t, url, "space", "delete", "team-a"), "space/team-a deleted\n")
	equalText(t, "missing", fails(t, url, "space", "get", "team-a"), "Error: not_found: space /team-a not found\n")
}

func TestTemplateApply(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	dir, pinned := imageDir(t)
	file := filepath.Join(dir, "counter.yaml")
	if err := os.WriteFile(file, []byte(goodTemplate), 0o644); err != nil {
		t.Fatal(err)
	}

	equalText(t, "first apply", ok(t, url, "template", "apply", "-f", file), "template/counter created\n")
	stored, err := fake.templates.get("default", "counter")
	if err != nil {
		t.Fatal(err)
	}
	if got := stored.GetSpec().GetContainers()[0].GetImage(); got != pinned {
		t.Errorf("stored image %q, want %q", got, pinned)
	}
	equalText(t, "second apply", ok(t, url, "template", "create", "-f", file), "template/counter unchanged\n")

	changed := filepath.Join(dir, "changed.yaml")
	if err := os.WriteFile(changed, []byte(strings.Replace(goodTemplate, "keep: 3", "keep: 4", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	equalText(t, "changed spec", ok(t, url, "template", "apply", "-f", changed),
		"template/counter revised: revision 2 (actors on older revisions stay there until moved: torpor template rollout counter)\n")
	equalText(t, "changed spec again", ok(t, url, "template", "apply", "-f", changed), "template/counter unchanged\n")

	// Nothing is written when any document is bad, even an earlier good one.
	bad := strings.Replace(minimal, "name: small", "name: fine", 1) + "---\n" + minimal + "    imag: x\n"
	r := torporWithInput(t, url, bad, "template", "apply", "-f", "-")
	if want := "Error: <stdin>:16: spec.containers[0].imag: unknown field in Container (known: name, image, "; !strings.HasPrefix(r.stderr, want) {
		t.Errorf("bad file: stderr %q, want prefix %q", r.stderr, want)
	}
	if r.code != 1 || fake.templates.len() != 1 {
		t.Errorf("bad file: exit %d, %d templates stored; want 1 and only counter", r.code, fake.templates.len())
	}

	twice := filepath.Join(dir, "twice.yaml")
	if err := os.WriteFile(twice, []byte(minimal+"---\n"+minimal), 0o644); err != nil {
		t.Fatal(err)
	}
	equalText(t, "same name twice", fails(t, url, "template", "apply", "-f", twice),
		"Error: "+twice+":11: template default/small is also defined at "+twice+":3\n")

	if _, err := fake.templates.update("default", "counter", func(t *torporv1.Template) error {
		t.Status.Phase = torporv1.TemplatePhase_TEMPLATE_PHASE_READY
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	equalText(t, "list", ok(t, url, "template", "list"),
		"NAME      REVISION   PHASE   CLASS    CONTAINERS   AGE\n"+
			"counter   2          READY   gvisor   counter      3h\n")
	var got torporv1.Template
	decodeAs(t, formatJSON, ok(t, url, "template", "apply", "-f", changed, "-o", "json"), &got)
	if got.GetMetadata().GetName() != "counter" || got.GetStatus().GetPhase() != torporv1.TemplatePhase_TEMPLATE_PHASE_READY {
		t.Errorf("apply -o json printed %v", &got)
	}
}

func TestActorCommands(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	fake.templates.put(&torporv1.Template{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "counter"},
		Status:   &torporv1.TemplateStatus{Phase: torporv1.TemplatePhase_TEMPLATE_PHASE_READY, Revision: 1, LatestRevision: 1},
	})

	equalText(t, "create", ok(t, url, "actor", "create", "a1", "--template", "counter", "--selector", "pool=fast,zone=z1"), "actor/a1 created\n")
	a1, err := fake.actors.get("default", "a1")
	if err != nil {
		t.Fatal(err)
	}
	wantSpec := &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1, WorkerSelector: map[string]string{"pool": "fast", "zone": "z1"}}
	if !proto.Equal(a1.GetSpec(), wantSpec) {
		t.Errorf("stored spec %v, want %v", a1.GetSpec(), wantSpec)
	}
	if msg := fails(t, url, "actor", "create", "a2"); !strings.Contains(msg, "give --template, or --from or --from-tag to fork") {
		t.Errorf("create without --template: %q", msg)
	}

	equalText(t, "update", ok(t, url, "actor", "update", "a1", "--selector", "pool=slow"), "actor/a1 updated\n")
	if len(fake.updates) != 1 || !slicesEqual(fake.updates[0].GetUpdateMask().GetPaths(), []string{"spec.worker_selector"}) {
		t.Fatalf("update requests %v, want one with mask spec.worker_selector", fake.updates)
	}
	var updated torporv1.Actor
	decodeAs(t, formatYAML, ok(t, url, "actor", "get", "a1", "-o", "yaml"), &updated)
	if updated.GetMetadata().GetVersion() != 2 || updated.GetSpec().GetWorkerSelector()["pool"] != "slow" || len(updated.GetSpec().GetWorkerSelector()) != 1 {
		t.Errorf("after update: %v", &updated)
	}
	equalText(t, "empty update", fails(t, url, "actor", "update", "a1"), "Error: nothing to update: give --selector or --template\n")
	ok(t, url, "actor", "update", "a1", "--template", "counter-v2")
	if last := fake.updates[len(fake.updates)-1]; !slicesEqual(last.GetUpdateMask().GetPaths(), []string{"spec.template"}) || last.GetActor().GetSpec().GetTemplate() != "counter-v2" {
		t.Errorf("template update sent %v", last)
	}
	ok(t, url, "actor", "update", "a1", "--template", "counter")

	fake.actors.put(&torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "a2"},
		Spec:     &torporv1.ActorSpec{Template: "counter", TemplateRevision: 1},
		Status: &torporv1.ActorStatus{
			State:  torporv1.ActorState_ACTOR_STATE_RUNNING,
			Worker: &torporv1.WorkerRef{Namespace: "default", Name: "w-1", Node: "n1", Ip: "10.0.0.2"},
		},
	})
	fake.actors.put(&torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "other", Name: "b1"},
		Spec:     &torporv1.ActorSpec{Template: "echo", TemplateRevision: 3},
		Status:   &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_CRASHED},
	})
	equalText(t, "list", ok(t, url, "actor", "list"),
		"NAME   TEMPLATE    STATE       WORKER   AGE\n"+
			"a1     counter@1   SUSPENDED   <none>   3h\n"+
			"a2     counter@1   RUNNING     w-1      3h\n")
	equalText(t, "list -A", ok(t, url, "actor", "list", "-A"),
		"NAME   SPACE     TEMPLATE    STATE       WORKER   AGE\n"+
			"a1     default   counter@1   SUSPENDED   <none>   3h\n"+
			"a2     default   counter@1   RUNNING     w-1      3h\n"+
			"b1     other     echo@3      CRASHED     <none>   3h\n")
	equalText(t, "get in another space", ok(t, url, "--space", "other", "actors", "get"),
		"NAME   TEMPLATE   STATE     WORKER   AGE\n"+
			"b1     echo@3     CRASHED   <none>   3h\n")

	equalText(t, "resume", ok(t, url, "actor", "resume", "a1", "--boot"), "actor/a1 resumed\n")
	if len(fake.resumes) != 1 || !fake.resumes[0].GetBoot() || fake.resumes[0].GetName() != "a1" {
		t.Errorf("resume requests %v", fake.resumes)
	}
	for _, step := range []struct {
		verb, printed string
		state         torporv1.ActorState
	}{
		{"suspend", "actor/a2 suspended\n", torporv1.ActorState_ACTOR_STATE_SUSPENDED},
		{"pause", "actor/a2 paused\n", torporv1.ActorState_ACTOR_STATE_PAUSED},
	} {
		equalText(t, step.verb, ok(t, url, "actor", step.verb, "a2"), step.printed)
		if a, _ := fake.actors.get("default", "a2"); a.GetStatus().GetState() != step.state {
			t.Errorf("after %s: state %v", step.verb, a.GetStatus().GetState())
		}
	}

	equalText(t, "delete", ok(t, url, "actor", "delete", "a1", "a2"), "actor/a1 deleted\nactor/a2 deleted\n")
	if fake.actors.len() != 1 {
		t.Errorf("%d actors left, want 1", fake.actors.len())
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

func TestActorDescribeAndEvents(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	created := time.Now().Add(-createdAgo).Truncate(time.Second)
	fake.actors.put(&torporv1.Actor{
		Metadata: &torporv1.ObjectMeta{Space: "default", Name: "a1", Uid: "u-1", Version: 7, Labels: map[string]string{"team": "x", "app": "y"}},
		Spec:     &torporv1.ActorSpec{Template: "counter", WorkerSelector: map[string]string{"pool": "fast"}},
		Status: &torporv1.ActorStatus{
			State:              torporv1.ActorState_ACTOR_STATE_RUNNING,
			Worker:             &torporv1.WorkerRef{Namespace: "default", Name: "w-1", Ip: "10.0.0.2"},
			CurrentTemplateUid: "t-1",
			Egress:             &torporv1.EgressPolicy{Mode: torporv1.EgressMode_EGRESS_MODE_DENY},
		},
	})
	fake.events = []*torporv1.ActorEvent{
		{Time: timestamppb.New(created), ToState: torporv1.ActorState_ACTOR_STATE_SUSPENDED, Reason: "created"},
		{Time: timestamppb.New(created.Add(time.Minute)), FromState: torporv1.ActorState_ACTOR_STATE_RESUMING, ToState: torporv1.ActorState_ACTOR_STATE_RUNNING, Worker: "w-1", DurationMs: 84},
	}
	stamp := created.UTC().Format(time.RFC3339)
	at := func(d time.Duration) string { return created.Add(d).UTC().Format(time.RFC3339) }
	equalText(t, "describe", ok(t, url, "actor", "describe", "a1"), `Name:         a1
Space:        default
UID:          u-1
Version:      7
Create Time:  `+stamp+` (3h ago)
Labels:       app=y,team=x
Spec:
  Template:         counter
  Worker Selector:  pool=fast
Status:
  State:                 RUNNING
  Worker:
    Namespace:  default
    Name:       w-1
    IP:         10.0.0.2
  Current Template UID:  t-1
  Egress:
    Mode:  DENY
URL:  http://a1.default.actors.localhost:7080/
Egress:  deny (the running workload's)
Events:
  TIME                   FROM       TO          WORKER   TOOK     REASON
  `+stamp+`   <none>     SUSPENDED   <none>   <none>   created
  `+at(time.Minute)+`   RESUMING   RUNNING     w-1      84ms     <none>
`)
	// Every time the CLI prints is UTC with its zone, as describe's are.
	equalText(t, "events", ok(t, url, "actor", "events", "a1"),
		"TIME                   FROM       TO          WORKER   TOOK     REASON\n"+
			stamp+"   <none>     SUSPENDED   <none>   <none>   created\n"+
			at(time.Minute)+"   RESUMING   RUNNING     w-1      84ms     <none>\n")
	var events torporv1.ListActorEventsResponse
	decodeAs(t, formatJSON, ok(t, url, "actor", "events", "a1", "-o", "json"), &events)
	if len(events.GetEvents()) != 2 {
		t.Errorf("events -o json: %v", &events)
	}
}

func TestTemplateDescribe(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	tmpl := goodTemplateProto("oci:/images/counter@sha256:abc")
	tmpl.Spec.Containers[0].Env = append(tmpl.Spec.Containers[0].Env, &torporv1.EnvVar{Name: "B", Value: "two words"})
	fake.templates.put(tmpl)
	out := ok(t, url, "template", "describe", "counter")
	for _, want := range []string{
		"\nSpec:\n  Containers:\n    counter:\n      Image:    oci:/images/counter@sha256:abc\n      Command:  [\"/hello\"]\n      Args:     [\"--port\",\"8080\"]\n",
		"      Env:\n        GREETING:\n          Value:  hello\n        B:\n          Value:  two words\n",
		"      Readiness Probe:\n        HTTP Get:\n          Path:  /healthz\n          Port:  8080\n",
		"      Mounts:\n        0:\n          Volume:  data\n          Path:    /data\n",
		"  Volumes:\n    data:\n      Kind:  DURABLE\n  Sandbox Class:  gvisor\n",
		"  Resources:\n    Memory MB:   256\n    CPU Millis:  500\n",
		"  Snapshot Policy:\n    On Pause:   FULL\n    On Commit:  DATA\n    On Resume:\n      From Data:  GOLDEN\n    Keep:       3\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe lacks\n%s\nin\n%s", want, out)
		}
	}
}

func TestWorkerCommands(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	equalText(t, "create", ok(t, url, "worker", "create", "w-1", "--node", "n1", "--ip", "10.0.0.2", "--pool", "small", "--labels", "pool=small"), "worker/w-1 created\n")
	w1, err := fake.workers.get(validate.WorkerNamespace, "w-1")
	if err != nil {
		t.Fatal(err)
	}
	want := &torporv1.WorkerSpec{Node: "n1", Ip: "10.0.0.2", Pool: "small", SandboxClass: "gvisor"}
	if !proto.Equal(w1.GetSpec(), want) || w1.GetMetadata().GetLabels()["pool"] != "small" {
		t.Errorf("stored %v", w1)
	}
	fake.workers.put(&torporv1.Worker{
		Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: "w-2"},
		Spec:     &torporv1.WorkerSpec{Node: "node-two", Ip: "10.0.0.3", Pool: "big"},
		Status: &torporv1.WorkerStatus{Actor: &torporv1.ActorRef{Space: "default", Name: "a1"},
			ActorLastActive: timestamppb.New(time.Now().Add(-90 * time.Second))},
	})
	fake.workers.put(&torporv1.Worker{
		Metadata: &torporv1.ObjectMeta{Space: validate.WorkerNamespace, Name: "w-3"},
		Spec:     &torporv1.WorkerSpec{Node: "node-two", Ip: "10.0.0.4", Pool: "big"},
		Status: &torporv1.WorkerStatus{Actor: &torporv1.ActorRef{Space: "default", Name: "a2"},
			ActorLastActive: timestamppb.New(time.Now().Add(-time.Hour)), ActorInFlight: 2},
	})
	equalText(t, "list", ok(t, url, "worker", "list"),
		"NAME   NODE       IP         POOL    ACTOR        IDLE        AGE\n"+
			"w-1    n1         10.0.0.2   small   <none>       <none>      3h\n"+
			"w-2    node-two   10.0.0.3   big     default/a1   90s         3h\n"+
			"w-3    node-two   10.0.0.4   big     default/a2   serving 2   3h\n")
	equalText(t, "delete", ok(t, url, "worker", "delete", "w-1"), "worker/w-1 deleted\n")
}

func TestSnapshotCommands(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	snap := &torporv1.Snapshot{
		Metadata:     &torporv1.ObjectMeta{Space: "default", Name: "s-1"},
		ActorName:    "a1",
		Scope:        torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		TemplateName: "counter",
		SizeBytes:    3 << 20,
	}
	fake.snapshots.put(snap)
	fake.snapshots.put(&torporv1.Snapshot{
		Metadata:     &torporv1.ObjectMeta{Space: "default", Name: "s-2"},
		ActorName:    "a1",
		Scope:        torporv1.SnapshotScope_SNAPSHOT_SCOPE_DATA,
		TemplateName: "counter",
		SizeBytes:    512,
		Node:         "n1",
	})
	// A golden build's snapshot is recorded under its revision's uid.
	fake.snapshots.put(&torporv1.Snapshot{
		Metadata:     &torporv1.ObjectMeta{Space: "default", Name: "g-1"},
		ActorUid:     "rev-uid",
		TemplateUid:  "rev-uid",
		Scope:        torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL,
		TemplateName: "counter@1",
		SizeBytes:    1 << 20,
	})
	equalText(t, "list", ok(t, url, "snapshot", "list"),
		"NAME   KIND     ACTOR    SCOPE   TEMPLATE    SIZE      NODE     AGE\n"+
			"g-1    golden   <none>   FULL    counter@1   1.0 MiB   <none>   3h\n"+
			"s-1    actor    a1       FULL    counter     3.0 MiB   <none>   3h\n"+
			"s-2    actor    a1       DATA    counter     512 B     n1       3h\n")
	var got torporv1.Snapshot
	decodeAs(t, formatYAML, ok(t, url, "snapshot", "get", "s-1", "-o", "yaml"), &got)
	if !proto.Equal(&got, snap) {
		t.Errorf("get -o yaml: %v, want %v", &got, snap)
	}
	if out := ok(t, url, "snapshot", "describe", "s-1"); !strings.Contains(out, "\nScope:          FULL\n") {
		t.Errorf("describe:\n%s", out)
	}
	equalText(t, "delete", ok(t, url, "snapshot", "delete", "s-1"), "snapshot/s-1 deleted\n")
	equalText(t, "gone", fails(t, url, "snapshot", "get", "s-1"), "Error: not_found: snapshot default/s-1 not found\n")
}

func TestListFollowsPages(t *testing.T) {
	isolate(t)
	fake, url := startFakeAPI(t)
	for _, name := range []string{"e", "d", "c", "b", "a"} {
		fake.spaces.put(&torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: name}})
	}
	equalText(t, "list", ok(t, url, "space", "list"), "NAME   AGE\na      3h\nb      3h\nc      3h\nd      3h\ne      3h\n")
	r := torpor(t, url, "actor", "list")
	if r.stdout != "" || r.stderr != "No actors found.\n" || r.code != 0 {
		t.Errorf("empty list: %+v", r)
	}
}

func TestServerSelection(t *testing.T) {
	fake, url := startFakeAPI(t)
	fake.spaces.put(&torporv1.Space{Metadata: &torporv1.ObjectMeta{Name: "found"}})
	const unreachable = "http://127.0.0.1:1"
	tests := []struct {
		name, flag, env, config string
	}{
		{name: "flag wins over everything", flag: url, env: unreachable, config: "server: " + unreachable},
		{name: "environment wins over config", env: url, config: "server: " + unreachable},
		{name: "config file", config: "server: " + url},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			configHome := t.TempDir()
			t.Setenv("XDG_CONFIG_HOME", configHome)
			t.Setenv("TORPOR_SERVER", tt.env)
			if tt.config != "" {
				if err := os.MkdirAll(filepath.Join(configHome, "torpor"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(configHome, "torpor", "config.yaml"), []byte(tt.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			equalText(t, "get", ok(t, tt.flag, "space", "get", "found"), "NAME    AGE\nfound   3h\n")
		})
	}
}

// TestBadClientConfig: a config file with an unknown field is an error
// naming the file and the field.
func TestBadClientConfig(t *testing.T) {
	isolate(t)
	path, err := client.ConfigPath()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("sever: http://typo\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if msg := fails(t, "", "space", "list"); !strings.Contains(msg, path) || !strings.Contains(msg, "sever") {
		t.Errorf("bad config file: %q, want it named with the bad field", msg)
	}
}

func TestDataDir(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", "/xdg/data")
	if dir, err := DataDir(); err != nil || dir != "/xdg/data/torpor" {
		t.Errorf("DataDir with XDG_DATA_HOME = %q, %v", dir, err)
	}
	t.Setenv("XDG_DATA_HOME", "")
	t.Setenv("HOME", "/home/u")
	if dir, err := DataDir(); err != nil || dir != "/home/u/.local/share/torpor" {
		t.Errorf("DataDir from HOME = %q, %v", dir, err)
	}
}

func TestErrors(t *testing.T) {
	isolate(t)
	tests := []struct {
		name string
		args []string
		want string // prefix of stderr
	}{
		{"unreachable server", []string{"--server", "http://127.0.0.1:1", "space", "list"}, "Error: unavailable: "},
		{"bad output format", []string{"space", "list", "-o", "xml"}, "Error: -o \"xml\": want table, wide, name, json, yaml or jsonpath=TEMPLATE\n"},
		{"unknown command", []string{"spaces", "frobnicate"}, "Error: unknown command \"frobnicate\""},
		{"missing file", []string{"template", "apply", "-f", "/nonexistent.yaml"}, "Error: read templates: open /nonexistent.yaml: no such file or directory\n"},
		{"missing name", []string{"actor", "describe"}, "Error: requires at least 1 arg(s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if msg := fails(t, "", tt.args...); !strings.HasPrefix(msg, tt.want) {
				t.Errorf("stderr %q, want prefix %q", msg, tt.want)
			}
		})
	}
}

func TestFormatAge(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-5 * time.Second, "0s"},
		{0, "0s"},
		{5 * time.Second, "5s"},
		{119 * time.Second, "119s"},
		{2 * time.Minute, "2m"},
		{3*time.Minute + 59*time.Second, "3m"},
		{119 * time.Minute, "119m"},
		{2 * time.Hour, "2h"},
		{47 * time.Hour, "47h"},
		{48 * time.Hour, "2d"},
		{4*24*time.Hour + 23*time.Hour, "4d"},
		{729 * 24 * time.Hour, "729d"},
		{3 * 365 * 24 * time.Hour, "3y"},
	}
	for _, tt := range tests {
		if got := formatAge(tt.d); got != tt.want {
			t.Errorf("formatAge(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
	if got := age(nil, time.Now()); got != "<unknown>" {
		t.Errorf("age(nil) = %q", got)
	}
}

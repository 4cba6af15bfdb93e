package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/server"
)

// TestJSONPath: -o jsonpath=TEMPLATE applies kubectl's JSONPath to the
// JSON form, a listing's as {"items": [...]}; a bad template is refused
// before any call, naming -o.
func TestJSONPath(t *testing.T) {
	_, url := actorsOn(t, "a1", "a2")
	for _, tc := range []struct{ args, want string }{
		{"actor get a1 -o jsonpath={.status.state}", "SUSPENDED\n"},
		{"actor get a1 -o jsonpath={.metadata.name}/{.spec.template}", "a1/counter\n"},
		{"actor list -o jsonpath={.items[*].metadata.name}", "a1 a2\n"},
		{"actor get -o jsonpath={range.items[*]}{.metadata.name}={.status.state}{\"\\n\"}{end}", "a1=SUSPENDED\na2=SUSPENDED\n"},
		{"template get counter -o jsonpath={.status.phase}", "READY\n"},
	} {
		equalText(t, tc.args, ok(t, url, strings.Fields(tc.args)...), tc.want)
	}
	if msg := fails(t, url, "actor", "get", "a1", "-o", "jsonpath={.status.state"); !strings.Contains(msg, "-o jsonpath={.status.state") {
		t.Errorf("bad template: %q", msg)
	}
	if msg := fails(t, url, "actor", "get", "a1", "-o", "jsonpath={.status.nope}"); !strings.Contains(msg, "nope") {
		t.Errorf("missing key: %q", msg)
	}
}

// TestActorWait: actor wait --for=state=STATE returns once each actor is
// in it, reading only; past --timeout it fails naming where they are.
func TestActorWait(t *testing.T) {
	fake, url := actorsOn(t, "a1", "a2")
	equalText(t, "already there", ok(t, url, "actor", "wait", "a1", "a2", "--for=state=suspended"), "actor/a1 is SUSPENDED\nactor/a2 is SUSPENDED\n")
	if msg := fails(t, url, "actor", "wait", "a1", "--for=state=RUNNING", "--timeout", "600ms"); !strings.Contains(msg, "timed out after 600ms waiting for state RUNNING: a1 is SUSPENDED") {
		t.Errorf("timeout: %q", msg)
	}
	if len(fake.resumes) != 0 {
		t.Errorf("actor wait resumed: %v", fake.resumes)
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		fake.setState("default", "a1", torporv1.ActorState_ACTOR_STATE_RUNNING) //nolint:errcheck // the wait below tells
	}()
	equalText(t, "reached", ok(t, url, "actor", "wait", "a1", "--for=state=RUNNING", "--timeout", "1m"), "actor/a1 is RUNNING\n")
	for args, want := range map[string]string{
		"--for=state=BOGUS": "no such state; want one of SUSPENDED, RESUMING, RUNNING",
		"--for=phase=READY": "want state=STATE",
		"--for=state=":      "want state=STATE",
	} {
		if msg := fails(t, url, "actor", "wait", "a1", args); !strings.Contains(msg, want) {
			t.Errorf("%s: %q, want %q", args, msg, want)
		}
	}
	if msg := fails(t, url, "actor", "wait", "nobody", "--for=state=RUNNING"); !strings.Contains(msg, "nobody") {
		t.Errorf("missing actor: %q", msg)
	}
}

// TestDidYouMean: a mistyped verb below the root is refused with the
// verbs it may have meant, not answered with help and status 0.
func TestDidYouMean(t *testing.T) {
	_, url := actorsOn(t)
	for args, want := range map[string]string{
		"actor lsit":     "unknown command \"lsit\" for \"torpor actor\"\n\nDid you mean this?\n\tlist",
		"token craete":   "Did you mean this?\n\tcreate",
		"template aply":  "Did you mean this?\n\tapply",
		"snapshot xyzzy": "unknown command \"xyzzy\" for \"torpor snapshot\"",
	} {
		if msg := fails(t, url, strings.Fields(args)...); !strings.Contains(msg, want) {
			t.Errorf("torpor %s: %q, want %q", args, msg, want)
		}
	}
}

// TestCompletion: shells complete the names of the objects a verb takes
// (a1, a2 in the selected space), never for create, and not a name
// already given.
func TestCompletion(t *testing.T) {
	_, url := actorsOn(t, "a1", "a2", "b1")
	complete := func(args ...string) []string {
		t.Helper()
		out := ok(t, url, append([]string{"__complete"}, args...)...)
		var names []string
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			if !strings.HasPrefix(line, ":") {
				names = append(names, line)
			}
		}
		return names
	}
	for args, want := range map[string]string{
		"actor get a":        "a1,a2",
		"actor suspend a1 ":  "a2,b1",
		"actor exec a1 ":     "",
		"actor describe ":    "a1,a2,b1",
		"actor create ":      "",
		"template rollout c": "counter",
		"actor logs b":       "b1",
	} {
		fields := strings.Fields(args)
		if strings.HasSuffix(args, " ") {
			fields = append(fields, "")
		}
		if got := strings.Join(complete(fields...), ","); got != want {
			t.Errorf("completion of %q: %q, want %q", args, got, want)
		}
	}
}

// TestGetOutputApplies: what `template get -o yaml` (or -o json) prints
// applies again as it is, server-set fields and all: unchanged, or a new
// revision once edited; several templates print as a List, which applies
// too.
func TestGetOutputApplies(t *testing.T) {
	isolate(t)
	_, url := realServer(t, server.Options{})
	dir, _ := imageDir(t)
	file := filepath.Join(dir, "counter.yaml")
	if err := os.WriteFile(file, []byte(goodTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, url, "template", "apply", "-f", file)
	other := filepath.Join(dir, "other.yaml")
	if err := os.WriteFile(other, []byte(strings.Replace(goodTemplate, "name: counter", "name: other", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, url, "template", "apply", "-f", other)
	apply := func(what, doc, want string) {
		t.Helper()
		r := torporWithInput(t, url, doc, "template", "apply", "-f", "-")
		if r.code != 0 {
			t.Fatalf("%s: apply -f - of get's output: exit %d: %s\n%s", what, r.code, r.stderr, doc)
		}
		equalText(t, what, r.stdout, want)
	}
	for _, format := range []string{formatYAML, formatJSON} {
		out := ok(t, url, "template", "get", "counter", "-o", format)
		if !strings.Contains(out, "apiVersion") || !strings.Contains(out, "Template") {
			t.Errorf("-o %s has no template header:\n%s", format, out)
		}
		apply("-o "+format, out, "template/counter unchanged\n")
	}
	edited := strings.Replace(ok(t, url, "template", "get", "counter", "-o", "yaml"), "keep: 3", "keep: 5", 1)
	apply("edited", edited, "template/counter revised: revision 2 (actors on older revisions stay there until moved: torpor template rollout counter)\n")
	list := ok(t, url, "template", "get", "-o", "yaml")
	if !strings.Contains(list, "kind: List") {
		t.Errorf("a listing of templates is no List:\n%s", list)
	}
	apply("a List", list, "template/counter unchanged\ntemplate/other unchanged\n")
}

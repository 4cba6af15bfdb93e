package server

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/metricstest"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// TestStateGauges: the control plane's metrics count actors by space and
// state and templates by space and phase, every state of a space seen
// reported (zeros too), and their HELP texts name their labels.
func TestStateGauges(t *testing.T) {
	ctx := context.Background()
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	for _, a := range []struct {
		space, name string
		state       torporv1.ActorState
	}{
		{"default", "a1", torporv1.ActorState_ACTOR_STATE_SUSPENDED},
		{"default", "a2", torporv1.ActorState_ACTOR_STATE_SUSPENDED},
		{"default", "a3", torporv1.ActorState_ACTOR_STATE_CRASHED},
		{"team", "b1", torporv1.ActorState_ACTOR_STATE_PAUSED},
	} {
		if _, err := r.store.Actors().Create(ctx, &torporv1.Actor{
			Metadata: &torporv1.ObjectMeta{Space: a.space, Name: a.name},
			Spec:     &torporv1.ActorSpec{Template: "t", TemplateRevision: 1},
			Status:   &torporv1.ActorStatus{State: a.state},
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tm := range []struct {
		name  string
		phase torporv1.TemplatePhase
	}{{"t", torporv1.TemplatePhase_TEMPLATE_PHASE_READY}, {"broken", torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED}} {
		if _, err := r.store.Templates().Create(ctx, &torporv1.Template{
			Metadata: &torporv1.ObjectMeta{Space: "default", Name: tm.name},
			Spec:     &torporv1.TemplateSpec{},
			Status:   &torporv1.TemplateStatus{Phase: tm.phase},
		}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := r.admin(t).Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %s", resp.Status)
	}
	for _, want := range []string{
		`torpor_actors{space="default",state="SUSPENDED"} 2`,
		`torpor_actors{space="default",state="CRASHED"} 1`,
		`torpor_actors{space="default",state="RUNNING"} 0`,
		`torpor_actors{space="team",state="PAUSED"} 1`,
		`torpor_actors{space="team",state="SUSPENDED"} 0`,
		`torpor_templates{phase="READY",space="default"} 1`,
		`torpor_templates{phase="FAILED",space="default"} 1`,
		`torpor_templates{phase="BUILDING",space="default"} 0`,
	} {
		if !strings.Contains(string(page), want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(string(page), "torpor_actors", "torpor_templates"))
		}
	}
	metricstest.HelpNamesLabels(t, newWorkersCollector(r.store), newActorsCollector(r.store), newTemplatesCollector(r.store))
}

func grepLines(page string, prefixes ...string) string {
	var out []string
	for line := range strings.SplitSeq(page, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				out = append(out, line)
			}
		}
	}
	return strings.Join(out, "\n")
}

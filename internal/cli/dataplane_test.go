package cli

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// ExecActor needs HTTP/2, which the fake's server does not speak; exec
// is tested against real sandboxes (e2e.TestExecAndStats).
func (f *fakeAPI) ExecActor(context.Context, *connect.BidiStream[torporv1.ExecActorRequest, torporv1.ExecOutput]) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New("not in the fake"))
}

// fakeLog is what the fake's actors logged: two containers, a line cut
// in two records, torpor's marker.
var fakeLog = []*torporv1.LogRecord{
	{Time: timestamppb.New(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)), Container: "app", Stream: "stdout", Text: []byte("hello")},
	{Time: timestamppb.New(time.Date(2026, 12, 1, 8, 0, 1, 0, time.UTC)), Container: "app", Stream: "stderr", Text: []byte("part one "), Partial: true},
	{Time: timestamppb.New(time.Date(2026, 12, 1, 8, 0, 1, 0, time.UTC)), Container: "app", Stream: "stderr", Text: []byte("and two")},
	{Time: timestamppb.New(time.Date(2026, 12, 1, 8, 0, 2, 0, time.UTC)), Stream: "torpor", Text: []byte("suspended")},
	{Time: timestamppb.New(time.Date(2026, 12, 1, 8, 0, 3, 0, time.UTC)), Container: "side", Stream: "stdout", Text: []byte("from the side")},
}

// GetActorLogs sends fakeLog's records of the request's container (all
// without one), the last tail, in two messages.
func (f *fakeAPI) GetActorLogs(_ context.Context, req *connect.Request[torporv1.GetActorLogsRequest], stream *connect.ServerStream[torporv1.GetActorLogsResponse]) error {
	if _, err := f.actors.get(req.Msg.GetSpace(), req.Msg.GetName()); err != nil {
		return err
	}
	var recs []*torporv1.LogRecord
	for _, r := range fakeLog {
		if c := req.Msg.GetContainer(); c == "" || r.GetContainer() == c {
			recs = append(recs, r)
		}
	}
	if n := int(req.Msg.GetTail()); n > 0 && n < len(recs) {
		recs = recs[len(recs)-n:]
	}
	half := len(recs) / 2
	for _, part := range [][]*torporv1.LogRecord{recs[:half], recs[half:]} {
		if err := stream.Send(&torporv1.GetActorLogsResponse{Records: part}); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeAPI) GetActorStats(_ context.Context, req *connect.Request[torporv1.GetRequest]) (*connect.Response[torporv1.ActorStats], error) {
	a, err := f.actors.get(req.Msg.GetSpace(), req.Msg.GetName())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&torporv1.ActorStats{
		State: a.GetStatus().GetState(), Worker: "w1", Started: timestamppb.New(time.Now().Add(-time.Minute)),
		CpuSeconds: 1.5, MemoryBytes: 3 << 20, LatestSnapshotBytes: 1536, SnapshotsBytes: 5 << 30, Snapshots: 2,
	}), nil
}

func TestActorLogsAndStats(t *testing.T) {
	isolate(t)
	f, url := startFakeAPI(t)
	f.actors.put(&torporv1.Actor{Metadata: &torporv1.ObjectMeta{Space: "default", Name: "a1"}, Status: &torporv1.ActorStatus{State: torporv1.ActorState_ACTOR_STATE_RUNNING}})

	equalText(t, "logs", ok(t, url, "actor", "logs", "a1"), ""+
		"2026-12-01T08:00:00.000Z app hello\n"+
		"2026-12-01T08:00:01.000Z app part one and two\n"+
		"2026-12-01T08:00:02.000Z -- suspended\n"+
		"2026-12-01T08:00:03.000Z side from the side\n")
	equalText(t, "logs -c side", ok(t, url, "actor", "logs", "a1", "-c", "side"), "2026-12-01T08:00:03.000Z side from the side\n")
	// JSON carries the text as text, a record a line.
	equalText(t, "logs -o json", ok(t, url, "actor", "logs", "a1", "-c", "app", "-o", "json"), ""+
		`{"time":"2026-12-01T08:00:00Z","container":"app","stream":"stdout","text":"hello"}`+"\n"+
		`{"time":"2026-12-01T08:00:01Z","container":"app","stream":"stderr","text":"part one ","partial":true}`+"\n"+
		`{"time":"2026-12-01T08:00:01Z","container":"app","stream":"stderr","text":"and two"}`+"\n")
	if msg := fails(t, url, "actor", "logs", "missing"); !strings.Contains(msg, "not_found") {
		t.Errorf("logs of a missing actor: %q", msg)
	}
	if msg := fails(t, url, "actor", "logs", "a1", "--since", "yesterday"); !strings.Contains(msg, "--since") {
		t.Errorf("logs --since yesterday: %q", msg)
	}

	stats := strings.Split(strings.TrimSpace(ok(t, url, "actor", "stats", "a1")), "\n")
	if len(stats) != 2 || strings.Join(strings.Fields(stats[0]), " ") != "STATE WORKER UP CPU MEMORY SNAPSHOTS LATEST ALL" ||
		strings.Join(strings.Fields(stats[1]), " ") != "RUNNING w1 1m0s 1.5s 3.0 MiB 2 1.5 KiB 5.0 GiB" {
		t.Errorf("stats:\n%s", strings.Join(stats, "\n"))
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"10m":                  now.Add(-10 * time.Minute),
		"2026-12-01T08:00:00Z": time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC),
	} {
		if got, err := parseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-5m", "yesterday", ""} {
		if _, err := parseSince(in, now); err == nil {
			t.Errorf("parseSince(%q) succeeded", in)
		}
	}
}

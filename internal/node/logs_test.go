package node

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/actorlog"
	"github.com/torpor-dev/torpor/internal/runtime"
)

func texts(recs []*torporv1.LogRecord) []string {
	var out []string
	for _, r := range recs {
		s := r.GetContainer() + "/" + r.GetStream() + ":" + string(r.GetText())
		if r.GetPartial() {
			s += "…"
		}
		out = append(out, s)
	}
	return out
}

// TestActorLogFromFIFOs: what a workload writes into its slot's FIFOs
// becomes its actor's records, a line each, a line not ended yet as a
// partial record; what is left in a FIFO when reading stops is read
// first; followers get new records until the log closes.
func TestActorLogFromFIFOs(t *testing.T) {
	root := t.TempDir()
	l := newActorLogs(filepath.Join(root, "logs"), filepath.Join(root, "output"), slog.New(slog.DiscardHandler))
	dir, err := l.outputDir("w0")
	if err != nil {
		t.Fatal(err)
	}
	l.attach("w0", "actor-1", []string{"app", "side"})
	_, follow, err := l.read("actor-1", actorlog.Filter{Container: "app"}, true)
	if err != nil || follow == nil {
		t.Fatalf("follow: %v", err)
	}
	// A workload's end of the FIFOs, opened as the runtime opens them.
	write := func(i int, stream, data string) {
		f, err := os.OpenFile(runtime.OutputPath(dir, i, stream), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(data); err != nil {
			t.Fatal(err)
		}
	}
	write(0, "out", "one\ntw")
	select {
	case r := <-follow:
		if string(r.GetText()) != "one" || r.GetPartial() || r.GetStream() != "stdout" {
			t.Fatalf("followed %v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no record followed")
	}
	write(1, "err", "side says\n")
	write(0, "out", "o\n")
	l.detach("w0")
	l.mark("actor-1", "suspended (checkpoint %s)", "op-1")
	recs, _, err := l.read("actor-1", actorlog.Filter{}, false)
	if err != nil {
		t.Fatal(err)
	}
	got := texts(recs)
	// The two FIFOs are read apart: only each one's order is kept.
	if len(got) != 5 || got[0] != "app/stdout:one" || got[4] != "/torpor:suspended (checkpoint op-1)" ||
		strings.Join(filter(got[1:4], "app/"), ",") != "app/stdout:tw…,app/stdout:o" || !slices.Contains(got, "side/stderr:side says") {
		t.Fatalf("records %q", got)
	}
	l.close("actor-1")
	for r := range follow {
		_ = r // the follower drains and ends with the log
	}
	if recs, _, _ := l.read("actor-1", actorlog.Filter{Container: "side"}, false); len(recs) != 1 {
		t.Fatalf("records of container side: %q", texts(recs))
	}
}

func filter(s []string, prefix string) []string {
	var out []string
	for _, x := range s {
		if strings.HasPrefix(x, prefix) {
			out = append(out, x)
		}
	}
	return out
}

// TestActorLogBound: a log holds at most maxLogBytes on disk, keeping the
// newest records, and its records survive a move through a snapshot tree
// unchanged.
func TestActorLogBound(t *testing.T) {
	root := t.TempDir()
	l := newActorLogs(filepath.Join(root, "logs"), filepath.Join(root, "output"), slog.New(slog.DiscardHandler))
	a, err := l.open("actor-1")
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Repeat("x", 1000)
	const n = 5000 // about 5 MB, over twice the bound
	start := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	for i := range n {
		if err := a.append(&torporv1.LogRecord{Time: timestamppb.New(start.Add(time.Duration(i) * time.Millisecond)), Container: "app", Stream: "stdout", Text: fmt.Appendf(nil, "%d %s", i, line)}); err != nil {
			t.Fatal(err)
		}
	}
	var size int64
	for _, name := range actorlog.Files {
		fi, err := os.Stat(filepath.Join(root, "logs", "actor-1", name))
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	if size > maxLogBytes {
		t.Fatalf("the log takes %d bytes, more than %d", size, maxLogBytes)
	}
	recs, _, err := l.read("actor-1", actorlog.Filter{Since: start.Add((n - 10) * time.Millisecond)}, false)
	if err != nil || len(recs) != 10 || !strings.HasPrefix(string(recs[9].GetText()), fmt.Sprint(n-1, " ")) {
		t.Fatalf("the last 10 records: %d, %v", len(recs), err)
	}
	all, _, _ := l.read("actor-1", actorlog.Filter{}, false)
	if len(all) < 1000 || len(all) == n {
		t.Fatalf("%d records kept of %d", len(all), n)
	}

	tree := t.TempDir()
	if err := l.capture("actor-1", tree); err != nil {
		t.Fatal(err)
	}
	other := newActorLogs(filepath.Join(root, "logs2"), filepath.Join(root, "output2"), slog.New(slog.DiscardHandler))
	if err := other.restore("actor-1", tree); err != nil {
		t.Fatal(err)
	}
	moved, _, err := other.read("actor-1", actorlog.Filter{}, false)
	if err != nil || len(moved) != len(all) || !proto.Equal(moved[len(moved)-1], all[len(all)-1]) {
		t.Fatalf("after a move: %d records (want %d), %v", len(moved), len(all), err)
	}
}

package actorlog

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// rec is a record of container/stream (stream "torpor" without a
// container); text ending in "…" is partial.
func rec(who, text string) *torporv1.LogRecord {
	container, stream, _ := strings.Cut(who, "/")
	partial := strings.HasSuffix(text, "…")
	return &torporv1.LogRecord{Container: container, Stream: stream, Text: []byte(strings.TrimSuffix(text, "…")), Partial: partial}
}

func show(recs []*torporv1.LogRecord) string {
	var out []string
	for _, r := range recs {
		s := r.GetContainer() + "/" + r.GetStream() + ":" + string(r.GetText())
		if r.GetPartial() {
			s += "…"
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

func TestLastLines(t *testing.T) {
	log := []*torporv1.LogRecord{
		rec("app/stdout", "one"),
		rec("app/stdout", "tw…"),
		rec("app/stderr", "oops"),
		rec("app/stdout", "o"),
		rec("/torpor", "suspended"),
		rec("app/stdout", "thr…"),
	}
	for _, tc := range []struct {
		n    int
		want string
	}{
		{0, show(log)},
		{1, "app/stdout:thr…"},
		{2, "/torpor:suspended app/stdout:thr…"},
		// "two" came in two records, around stderr's line.
		{3, "app/stdout:tw… app/stdout:o /torpor:suspended app/stdout:thr…"},
		{4, "app/stdout:tw… app/stderr:oops app/stdout:o /torpor:suspended app/stdout:thr…"},
		{5, show(log)},
		{50, show(log)},
	} {
		if got := show(LastLines(log, tc.n)); got != tc.want {
			t.Errorf("LastLines(%d) = %s, want %s", tc.n, got, tc.want)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	at := timestamppb.New(time.Unix(1700000000, 123456789))
	for _, r := range []*torporv1.LogRecord{
		{Time: at, Container: "app", Stream: "stdout", Text: []byte("a line with  spaces")},
		{Time: at, Stream: "torpor", Text: []byte("resumed")},
		{Time: at, Container: "app", Stream: "stderr", Text: []byte("part"), Partial: true},
		{Time: at, Container: "app", Stream: "stdout", Text: []byte{}},
	} {
		line := Encode(r)
		got, ok := Decode(line[:len(line)-1])
		if !ok || !proto.Equal(got, r) {
			t.Errorf("%q decodes to %v, want %v", line, got, r)
		}
	}
	if _, ok := Decode([]byte("not a record")); ok {
		t.Error("a line that is no record decodes")
	}
	content := append(Encode(&torporv1.LogRecord{Time: at, Container: "app", Stream: "stdout", Text: []byte("x")}), "torn\n"...)
	content = append(content, Encode(&torporv1.LogRecord{Time: at, Container: "side", Stream: "stdout", Text: []byte("y")})...)
	if got := show(Parse(nil, content, Filter{Container: "side"})); got != "side/stdout:y" {
		t.Errorf("Parse of side's records: %s", got)
	}
	if got := Parse(nil, content, Filter{Since: at.AsTime().Add(time.Nanosecond)}); len(got) != 0 {
		t.Errorf("Parse since after every record: %s", show(got))
	}
}

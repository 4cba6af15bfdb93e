// Package actorlog is an actor's log as its holders keep it: the node
// that runs the actor (or last ran it), and the snapshots that carry it
// across suspends and moves (a logs/ directory in the snapshot's tree).
// Both answer a read alike (Filter, LastLines), so a log reads the same
// whoever holds it.
package actorlog

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

const (
	// Dir is where a snapshot's tree holds the actor's log.
	Dir = "logs"
	// MaxLineBytes: a longer line is cut into partial records.
	MaxLineBytes = 16 << 10
)

// Files are a log's files, oldest first: the current one, and the one
// before it once the current one was rotated.
var Files = []string{"previous", "current"}

// Encode is r as a line of a log file: time (Unix nanoseconds),
// container ("-" for none), stream, F or P (partial), the text.
func Encode(r *torporv1.LogRecord) []byte {
	container := r.GetContainer()
	if container == "" {
		container = "-"
	}
	flag := "F"
	if r.GetPartial() {
		flag = "P"
	}
	b := fmt.Appendf(nil, "%d %s %s %s ", r.GetTime().AsTime().UnixNano(), container, r.GetStream(), flag)
	b = append(b, r.GetText()...)
	return append(b, '\n')
}

// Decode reads one line of a log file (without its newline).
func Decode(line []byte) (*torporv1.LogRecord, bool) {
	fields := bytes.SplitN(line, []byte(" "), 5)
	if len(fields) != 5 {
		return nil, false
	}
	ns, err := strconv.ParseInt(string(fields[0]), 10, 64)
	if err != nil {
		return nil, false
	}
	r := &torporv1.LogRecord{Time: timestamppb.New(time.Unix(0, ns)), Container: string(fields[1]), Stream: string(fields[2]), Partial: string(fields[3]) == "P", Text: fields[4]}
	if r.Container == "-" {
		r.Container = ""
	}
	return r, true
}

// Parse appends to recs the records of a log file's content that f
// matches; a line that is no record (a torn write) is skipped.
func Parse(recs []*torporv1.LogRecord, content []byte, f Filter) []*torporv1.LogRecord {
	s := bufio.NewScanner(bytes.NewReader(content))
	s.Buffer(nil, MaxLineBytes+1024)
	for s.Scan() {
		if r, ok := Decode(bytes.Clone(s.Bytes())); ok && f.Match(r) {
			recs = append(recs, r)
		}
	}
	return recs
}

// Filter is what a read asks for: one container's records (empty:
// every container's and torpor's own), from a time on.
type Filter struct {
	Container string
	Since     time.Time
}

// Match: r is asked for.
func (f Filter) Match(r *torporv1.LogRecord) bool {
	if f.Container != "" && r.GetContainer() != f.Container {
		return false
	}
	return f.Since.IsZero() || !r.GetTime().AsTime().Before(f.Since)
}

// LastLines are the records of the last n lines of recs (all for n <= 0),
// in their order. A line is what one container's stream wrote up to a
// newline: a complete record, or partial records and the one that ends
// them (a line whose end is not there yet counts too). The streams'
// lines interleave, so a line's first records may come before another
// stream's later lines.
func LastLines(recs []*torporv1.LogRecord, n int) []*torporv1.LogRecord {
	if n <= 0 {
		return recs
	}
	type stream struct{ container, name string }
	line := map[stream]int{} // the line, counted from the end, each stream's records are in
	keep := make([]bool, len(recs))
	lines, kept := 0, 0
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		k := stream{r.GetContainer(), r.GetStream()}
		if _, seen := line[k]; !seen || !r.GetPartial() {
			lines++
			line[k] = lines
		}
		if line[k] <= n {
			keep[i] = true
			kept++
		}
	}
	out := make([]*torporv1.LogRecord, 0, kept)
	for i, r := range recs {
		if keep[i] {
			out = append(out, r)
		}
	}
	return out
}

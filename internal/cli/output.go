package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	"github.com/torpor-dev/torpor/internal/enum"
)

// none fills a table cell or describe value that has nothing to show.
const none = "<none>"

// printMessages writes messages as JSON or YAML: one message as itself,
// several (or a listing) as {"items": [...]}.
func printMessages(w io.Writer, format string, msgs []proto.Message, asList bool) error {
	var doc []byte
	if len(msgs) == 1 && !asList {
		b, err := protojson.Marshal(msgs[0])
		if err != nil {
			return fmt.Errorf("encode %s: %w", msgs[0].ProtoReflect().Descriptor().Name(), err)
		}
		doc = b
	} else {
		items := make([]json.RawMessage, len(msgs))
		for i, m := range msgs {
			b, err := protojson.Marshal(m)
			if err != nil {
				return fmt.Errorf("encode %s: %w", m.ProtoReflect().Descriptor().Name(), err)
			}
			items[i] = b
		}
		b, err := json.Marshal(struct {
			Items []json.RawMessage `json:"items"`
		}{items})
		if err != nil {
			return fmt.Errorf("encode list: %w", err)
		}
		doc = b
	}
	if format == formatYAML {
		y, err := yaml.JSONToYAML(doc)
		if err != nil {
			return fmt.Errorf("convert to YAML: %w", err)
		}
		_, err = w.Write(y)
		return err
	}
	// protojson's own multiline output varies its spacing on purpose;
	// indenting the compact form gives stable output.
	var indented bytes.Buffer
	if err := json.Indent(&indented, doc, "", "  "); err != nil {
		return fmt.Errorf("indent JSON: %w", err)
	}
	indented.WriteByte('\n')
	_, err := indented.WriteTo(w)
	return err
}

// printTable writes rows under headers in aligned columns, kubectl style.
func printTable(w io.Writer, headers []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, strings.Join(headers, "\t"))
	for _, row := range rows {
		cells := make([]string, len(row))
		for i, c := range row {
			cells[i] = orNone(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

// age renders how long ago t was, in the largest unit that still reads
// as at least 2 of it: 45s, 90s, 3m, 2h, 4d, 3y.
func age(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "<unknown>"
	}
	return formatAge(now.Sub(t.AsTime()))
}

func formatAge(d time.Duration) string {
	const (
		day  = 24 * time.Hour
		year = 365 * day
	)
	if d < 0 {
		// A clock slightly ahead of ours: the object is brand new.
		d = 0
	}
	for _, u := range []struct {
		size   time.Duration
		suffix string
	}{{year, "y"}, {day, "d"}, {time.Hour, "h"}, {time.Minute, "m"}} {
		if d >= 2*u.size {
			return fmt.Sprintf("%d%s", d/u.size, u.suffix)
		}
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// enumName is an enum value as users see it (enum.Name); the zero value
// means unset and shows as "".
func enumName(e protoreflect.Enum) string {
	if e.Number() == 0 {
		return ""
	}
	return enum.Name(e)
}

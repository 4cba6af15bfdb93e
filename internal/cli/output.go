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

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
)

// none fills a table cell or describe value that has nothing to show.
const none = "<none>"

// printMessages writes messages as JSON or YAML: one message as itself,
// several (or a listing) as {"items": [...]}. Enum values read as the
// tables show them (RUNNING, not ACTOR_STATE_RUNNING), as template files
// take them.
func printMessages(w io.Writer, format string, msgs []proto.Message, asList bool) error {
	var doc []byte
	if len(msgs) == 1 && !asList {
		b, err := marshalShort(msgs[0])
		if err != nil {
			return err
		}
		doc = b
	} else {
		items := make([]json.RawMessage, len(msgs))
		for i, m := range msgs {
			b, err := marshalShort(m)
			if err != nil {
				return err
			}
			items[i] = b
		}
		list := struct {
			APIVersion string            `json:"apiVersion,omitempty"`
			Kind       string            `json:"kind,omitempty"`
			Items      []json.RawMessage `json:"items"`
		}{Items: items}
		if len(msgs) > 0 && isTemplate(msgs[0]) {
			// Templates, which apply -f takes back.
			list.APIVersion, list.Kind = manifestAPIVersion, listKindName
		}
		b, err := json.Marshal(list)
		if err != nil {
			return fmt.Errorf("encode list: %w", err)
		}
		doc = b
	}
	if template, ok := strings.CutPrefix(format, formatJSONPath); ok {
		return printJSONPath(w, template, doc)
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

// marshalShort is m in protojson with its enum values' short names; a
// template carries the header of a template file (apiVersion, kind), so
// that what `get` prints, `apply -f` takes.
func marshalShort(m proto.Message) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // keeps numbers as protojson wrote them
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	renameEnums(v, m.ProtoReflect().Descriptor(), func(ed protoreflect.EnumDescriptor, name string) string {
		return strings.TrimPrefix(name, enum.Prefix(ed))
	})
	if obj, ok := v.(map[string]any); ok && isTemplate(m) {
		obj["apiVersion"], obj["kind"] = manifestAPIVersion, templateKindName
	}
	return json.Marshal(v)
}

func isTemplate(m proto.Message) bool {
	_, ok := m.(*torporv1.Template)
	return ok
}

// renameEnums renames, in place, the enum values of v, the protojson
// form of a message of type md.
func renameEnums(v any, md protoreflect.MessageDescriptor, rename func(protoreflect.EnumDescriptor, string) string) {
	obj, ok := v.(map[string]any)
	if !ok {
		return // a well-known type's own JSON form (a timestamp's string)
	}
	for key, val := range obj {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			continue
		}
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		each := func(val any) any {
			switch {
			case fd.Enum() != nil:
				if name, ok := val.(string); ok {
					return rename(fd.Enum(), name)
				}
			case fd.Message() != nil:
				renameEnums(val, fd.Message(), rename)
			}
			return val
		}
		switch vals := val.(type) {
		case []any:
			for i := range vals {
				vals[i] = each(vals[i])
			}
		case map[string]any:
			if md.Fields().ByJSONName(key).IsMap() {
				for k := range vals {
					vals[k] = each(vals[k])
				}
			} else {
				each(vals)
			}
		default:
			obj[key] = each(val)
		}
	}
}

// printTable writes rows under headers (none: rows alone) in aligned
// columns, kubectl style.
func printTable(w io.Writer, headers []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	if headers != nil {
		fmt.Fprintln(tw, strings.Join(headers, "\t"))
	}
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

// timestamp is how every time the CLI prints reads: UTC, RFC 3339, to the
// second ("2026-12-02T10:04:05Z"), so times from the server's events, the
// node's logs and another machine's terminal compare at a glance. Log
// lines add milliseconds (logTimestamp).
func timestamp(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}

// logTimestamp is timestamp with milliseconds, for log lines.
func logTimestamp(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
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

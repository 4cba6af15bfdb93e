package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/torpor-dev/torpor/internal/enum"
)

// entry is one line of a describe view: a label with a value, or a label
// heading an indented block.
type entry struct {
	label    string
	value    string
	children []entry
}

// describe writes a readable multi-line view of any API record, walking its
// fields in declaration order so new fields show up without code here.
// Metadata comes first and unindented, as the record's identity.
func describe(w io.Writer, m proto.Message, now time.Time) {
	var top []entry
	for _, e := range describeMessage(m.ProtoReflect(), now) {
		if e.label == "Metadata" {
			top = append(top, e.children...)
			continue
		}
		top = append(top, e)
	}
	writeEntries(w, top, "")
}

func describeMessage(msg protoreflect.Message, now time.Time) []entry {
	var entries []entry
	fields := msg.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !msg.Has(fd) {
			continue
		}
		label := fieldLabel(fd.Name())
		v := msg.Get(fd)
		switch {
		case fd.IsMap():
			entries = append(entries, entry{label: label, value: mapString(v.Map(), fd.MapValue(), now)})
		case fd.IsList() && isBlock(fd):
			list := v.List()
			block := entry{label: label}
			for j := range list.Len() {
				block.children = append(block.children, describeElement(list.Get(j).Message(), j, now))
			}
			entries = append(entries, block)
		case fd.IsList():
			list := v.List()
			values := make([]string, list.Len())
			for j := range list.Len() {
				values[j] = valueString(list.Get(j), fd, now)
			}
			encoded, _ := json.Marshal(values) // []string always encodes
			entries = append(entries, entry{label: label, value: string(encoded)})
		case isBlock(fd):
			if children := describeMessage(v.Message(), now); len(children) > 0 {
				entries = append(entries, entry{label: label, children: children})
			}
		default:
			entries = append(entries, entry{label: label, value: valueString(v, fd, now)})
		}
	}
	return entries
}

// isBlock says whether a field is shown as an indented block of its own
// fields; well-known types (timestamps) read better as one value.
func isBlock(fd protoreflect.FieldDescriptor) bool {
	return fd.Message() != nil && fd.Message().FullName().Parent() != "google.protobuf"
}

// describeElement shows a list element under its name field when it has
// one (containers, volumes, env), else under its index.
func describeElement(elem protoreflect.Message, index int, now time.Time) entry {
	children := describeMessage(elem, now)
	if fd := elem.Descriptor().Fields().ByName("name"); fd != nil && fd.Kind() == protoreflect.StringKind {
		if name := elem.Get(fd).String(); name != "" {
			// The name is the heading; repeating it inside adds nothing.
			children = slices.DeleteFunc(children, func(e entry) bool { return e.label == fieldLabel(fd.Name()) })
			return entry{label: name, children: children}
		}
	}
	return entry{label: fmt.Sprint(index), children: children}
}

func valueString(v protoreflect.Value, fd protoreflect.FieldDescriptor, now time.Time) string {
	switch {
	case fd.Enum() != nil:
		values := fd.Enum().Values()
		if ev := values.ByNumber(v.Enum()); ev != nil {
			return strings.TrimPrefix(string(ev.Name()), enum.Prefix(fd.Enum()))
		}
		return fmt.Sprint(v.Enum())
	case fd.Message() == nil:
		return v.String()
	}
	if ts, ok := v.Message().Interface().(*timestamppb.Timestamp); ok {
		return fmt.Sprintf("%s (%s ago)", timestamp(ts.AsTime()), age(ts, now))
	}
	encoded, err := protojson.Marshal(v.Message().Interface())
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(encoded)
}

func mapString(m protoreflect.Map, valueField protoreflect.FieldDescriptor, now time.Time) string {
	pairs := make([]string, 0, m.Len())
	m.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		pairs = append(pairs, k.String()+"="+valueString(v, valueField, now))
		return true
	})
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}

// acronyms keep their capitals in labels: "UID", not "Uid".
var acronyms = map[string]string{"uid": "UID", "ip": "IP", "id": "ID", "mb": "MB", "cpu": "CPU", "http": "HTTP"}

// fieldLabel turns a proto field name into a heading: worker_selector →
// "Worker Selector".
func fieldLabel(name protoreflect.Name) string {
	words := strings.Split(string(name), "_")
	for i, w := range words {
		if a, ok := acronyms[w]; ok {
			words[i] = a
		} else if w != "" {
			words[i] = strings.ToUpper(w[:1]) + w[1:]
		}
	}
	return strings.Join(words, " ")
}

func writeEntries(w io.Writer, entries []entry, indent string) {
	width := 0
	for _, e := range entries {
		if e.children == nil {
			width = max(width, len(e.label))
		}
	}
	for _, e := range entries {
		if e.children != nil {
			fmt.Fprintf(w, "%s%s:\n", indent, e.label)
			writeEntries(w, e.children, indent+"  ")
			continue
		}
		fmt.Fprintf(w, "%s%-*s  %s\n", indent, width+1, e.label+":", e.value)
	}
}

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/enum"
	"github.com/torpor-dev/torpor/internal/image"
	"github.com/torpor-dev/torpor/internal/validate"
)

// The header every template document carries.
const (
	manifestAPIVersion = "torpor.dev/v1"
	templateKindName   = "Template"
)

// serverOwned are the fields only the server sets. A manifest may carry
// them, as `template get -o yaml` prints them, so that its output applies
// again; they are ignored, the server setting them anyway.
var serverOwned = map[string]bool{
	"status":              true,
	"metadata.uid":        true,
	"metadata.version":    true,
	"metadata.createTime": true,
	"metadata.updateTime": true,
}

// fileError is a problem at a line of a manifest file: "FILE:LINE: ...".
type fileError struct {
	file string
	line int
	err  error
}

func (e *fileError) Error() string { return fmt.Sprintf("%s:%d: %v", e.file, e.line, e.err) }
func (e *fileError) Unwrap() error { return e.err }

// manifest is one template document of a file, with the line of every
// field it set so later checks (image pinning, validation) can point back
// into the file.
type manifest struct {
	file     string
	line     int // where the document starts
	template *torporv1.Template
	lines    map[string]int // protobuf JSON path (spec.containers[0].image) → line
}

// lineOf is the line of path, or of the nearest enclosing field the file
// set (a missing field is blamed on its parent).
func (m *manifest) lineOf(path string) int {
	for p := path; p != ""; p = parentPath(p) {
		if line, ok := m.lines[p]; ok {
			return line
		}
	}
	return m.line
}

func (m *manifest) errorAt(path string, err error) error {
	return &fileError{file: m.file, line: m.lineOf(path), err: err}
}

func parentPath(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// pinImages replaces every container image by its digest-pinned reference.
// Relative OCI layout paths are resolved against baseDir.
func (m *manifest) pinImages(ctx context.Context, baseDir string) error {
	for i, c := range m.template.GetSpec().GetContainers() {
		if c.GetImage() == "" {
			continue // validation names the missing image
		}
		pinned, err := image.Resolve(ctx, c.GetImage(), baseDir)
		if err != nil {
			// image's errors name the reference.
			path := fmt.Sprintf("spec.containers[%d].image", i)
			return m.errorAt(path, fmt.Errorf("%s: %w", path, err))
		}
		c.Image = pinned
	}
	return nil
}

// validate runs the server's checks locally, so a bad file is reported by
// line and nothing is sent.
func (m *manifest) validate() error {
	err := validate.Template(m.template, image.IsPinned)
	var fe *validate.FieldError
	if errors.As(err, &fe) {
		return m.errorAt(fe.Path, err)
	}
	if err != nil {
		return &fileError{file: m.file, line: m.line, err: err}
	}
	return nil
}

// maxManifestBytes bounds a template file (or stdin): templates are small,
// and the server refuses any request over 4 MiB anyway.
const maxManifestBytes = 1 << 20

// maxAliasedNodes bounds how many YAML nodes a file's aliases (*name) may
// add to it once followed. Anchors are for sharing small fragments (an env
// list between containers); without a bound a file of a few hundred KB
// whose aliases refer to lists full of aliases expands to gigabytes.
const maxAliasedNodes = 10_000

// readManifest reads a template file from r: at most one byte more than
// parseTemplates accepts, so an oversized file is refused without being
// read whole (stdin may never end).
func readManifest(r io.Reader) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
}

func readManifestFile(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readManifest(f)
}

// aliasBudget follows a file's aliases to count the nodes they add,
// without building anything: each anchored node's expanded size is
// computed once, so the count costs time linear in the file.
type aliasBudget struct {
	added int
	// size is the expanded size of nodes reached through an alias, capped
	// at maxAliasedNodes+1; -1 while being computed (an alias inside its
	// own anchor).
	size map[*yaml.Node]int
}

// check counts the nodes the aliases in n add, failing at the alias that
// takes the file past maxAliasedNodes.
func (b *aliasBudget) check(file string, n *yaml.Node) error {
	if n.Kind == yaml.AliasNode {
		b.added += b.expanded(n)
		if b.added > maxAliasedNodes {
			return &fileError{file: file, line: n.Line, err: fmt.Errorf("alias *%s: the file's aliases expand to more than %d values; write the values out, or share smaller fragments", n.Value, maxAliasedNodes)}
		}
		return nil
	}
	for _, c := range n.Content {
		if err := b.check(file, c); err != nil {
			return err
		}
	}
	return nil
}

// expanded is the number of nodes n stands for with its aliases followed.
func (b *aliasBudget) expanded(n *yaml.Node) int {
	n = dealias(n)
	if s, ok := b.size[n]; ok {
		if s < 0 {
			return maxAliasedNodes + 1 // contains itself: endless
		}
		return s
	}
	b.size[n] = -1
	s := 1
	for _, c := range n.Content {
		if s += b.expanded(c); s > maxAliasedNodes {
			s = maxAliasedNodes + 1
			break
		}
	}
	b.size[n] = s
	return s
}

// yamlSyntaxError matches the line yaml reports for malformed input, so
// syntax errors read like every other manifest error.
var yamlSyntaxError = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseTemplates reads every template document of a YAML file. Documents
// use protobuf JSON field names; enum values may drop their type prefix
// (FULL for SNAPSHOT_SCOPE_FULL). Any unknown field, wrong type or invalid
// enum value is an error naming file and line. The file's size and what
// its aliases add are bounded (maxManifestBytes, maxAliasedNodes).
func parseTemplates(file string, data []byte) ([]*manifest, error) {
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("%s: a template file may hold at most %d bytes (1 MiB); split it", file, maxManifestBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	aliases := &aliasBudget{size: map[*yaml.Node]int{}}
	var manifests []*manifest
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if m := yamlSyntaxError.FindStringSubmatch(err.Error()); m != nil {
				line, _ := strconv.Atoi(m[1]) // the pattern matched digits
				return nil, &fileError{file: file, line: line, err: errors.New(m[2])}
			}
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(doc.Content) == 0 || isNull(doc.Content[0]) {
			continue // an empty document, e.g. after a trailing ---
		}
		if err := aliases.check(file, &doc); err != nil {
			return nil, err
		}
		roots, err := listItems(file, doc.Content[0])
		if err != nil {
			return nil, err
		}
		for _, root := range roots {
			m, err := parseTemplate(file, root)
			if err != nil {
				return nil, err
			}
			manifests = append(manifests, m)
		}
	}
	if len(manifests) == 0 {
		return nil, fmt.Errorf("%s: no template documents", file)
	}
	return manifests, nil
}

// listKindName is the kind of a document of several: `template get -o
// yaml` of more than one template prints {apiVersion, kind: List, items}.
const listKindName = "List"

// listItems is the documents root holds: the items of a List, or root.
func listItems(file string, root *yaml.Node) ([]*yaml.Node, error) {
	if root.Kind != yaml.MappingNode {
		return []*yaml.Node{root}, nil
	}
	var items *yaml.Node
	isList := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, val := root.Content[i], dealias(root.Content[i+1])
		switch {
		case key.Value == "kind" && val.Value == listKindName:
			isList = true
		case key.Value == "items":
			items = val
		}
	}
	if !isList {
		return []*yaml.Node{root}, nil
	}
	d := &manifestDecoder{file: file}
	if items == nil || items.Kind != yaml.SequenceNode {
		return nil, d.errorAt(root.Line, "items", "a List needs items: a list of templates")
	}
	out := make([]*yaml.Node, len(items.Content))
	for i, item := range items.Content {
		out[i] = dealias(item)
	}
	return out, nil
}

func parseTemplate(file string, root *yaml.Node) (*manifest, error) {
	d := &manifestDecoder{file: file, lines: map[string]int{}}
	if root.Kind != yaml.MappingNode {
		return nil, d.wrongType(root, "document", "a mapping")
	}
	header := map[string]string{"apiVersion": manifestAPIVersion, "kind": templateKindName}
	seen := map[string]bool{}
	body := &yaml.Node{Kind: yaml.MappingNode, Line: root.Line}
	for i := 0; i+1 < len(root.Content); i += 2 {
		key, val := root.Content[i], dealias(root.Content[i+1])
		want, isHeader := header[key.Value]
		if !isHeader {
			body.Content = append(body.Content, key, val)
			continue
		}
		if seen[key.Value] {
			return nil, d.errorAt(key.Line, key.Value, "given twice")
		}
		if val.Kind != yaml.ScalarNode || val.Tag != "!!str" {
			return nil, d.wrongType(val, key.Value, "a string")
		}
		if val.Value != want {
			return nil, d.errorAt(val.Line, key.Value, "%q is not supported (want %q)", val.Value, want)
		}
		seen[key.Value] = true
	}
	for _, field := range []string{"apiVersion", "kind"} {
		if !seen[field] {
			return nil, d.errorAt(root.Line, field, "required (%q)", header[field])
		}
	}
	tree, err := d.message(body, (&torporv1.Template{}).ProtoReflect().Descriptor(), "")
	if err != nil {
		return nil, err
	}
	// The tree was checked against the descriptor, so these only fail on
	// values protojson reads more strictly than YAML (e.g. bad base64).
	encoded, err := json.Marshal(tree)
	if err != nil {
		return nil, &fileError{file: file, line: root.Line, err: err}
	}
	var t torporv1.Template
	if err := protojson.Unmarshal(encoded, &t); err != nil {
		return nil, &fileError{file: file, line: root.Line, err: err}
	}
	return &manifest{file: file, line: root.Line, template: &t, lines: d.lines}, nil
}

// manifestDecoder turns YAML nodes into the JSON shape protojson reads,
// checking each against the message descriptor and recording lines.
type manifestDecoder struct {
	file  string
	lines map[string]int
}

func (d *manifestDecoder) errorAt(line int, path, format string, args ...any) error {
	return &fileError{file: d.file, line: line, err: &validate.FieldError{Path: path, Reason: fmt.Sprintf(format, args...)}}
}

// wrongType blames the field's key rather than its value: a block mapping
// or list starts on the line after its key.
func (d *manifestDecoder) wrongType(n *yaml.Node, path, want string) error {
	line, ok := d.lines[path]
	if !ok {
		line = n.Line
	}
	return d.errorAt(line, path, "want %s, got %s", want, nodeDescription(n))
}

func (d *manifestDecoder) message(n *yaml.Node, md protoreflect.MessageDescriptor, path string) (map[string]any, error) {
	if n.Kind != yaml.MappingNode {
		return nil, d.wrongType(n, path, "a mapping")
	}
	out := map[string]any{}
	seen := map[protoreflect.FieldNumber]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		fd := md.Fields().ByJSONName(key.Value)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(key.Value))
		}
		if fd == nil {
			return nil, d.errorAt(key.Line, joinPath(path, key.Value), "unknown field in %s (known: %s)", md.Name(), strings.Join(knownFields(md, path), ", "))
		}
		fieldPath := joinPath(path, fd.JSONName())
		switch {
		case serverOwned[fieldPath]:
			continue
		case seen[fd.Number()]:
			return nil, d.errorAt(key.Line, fieldPath, "given twice")
		}
		seen[fd.Number()] = true
		d.lines[fieldPath] = key.Line
		v, err := d.field(dealias(val), fd, fieldPath)
		if err != nil {
			return nil, err
		}
		if v != nil {
			out[fd.JSONName()] = v
		}
	}
	return out, nil
}

func (d *manifestDecoder) field(n *yaml.Node, fd protoreflect.FieldDescriptor, path string) (any, error) {
	switch {
	case isNull(n):
		return nil, nil // as if the field were left out
	case fd.IsMap():
		if n.Kind != yaml.MappingNode {
			return nil, d.wrongType(n, path, "a mapping")
		}
		out := map[string]any{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := dealias(n.Content[i])
			if key.Kind != yaml.ScalarNode {
				return nil, d.wrongType(key, path, "a scalar key")
			}
			entryPath := fmt.Sprintf("%s[%q]", path, key.Value)
			d.lines[entryPath] = key.Line
			v, err := d.singular(dealias(n.Content[i+1]), fd.MapValue(), entryPath)
			if err != nil {
				return nil, err
			}
			out[key.Value] = v
		}
		return out, nil
	case fd.IsList():
		if n.Kind != yaml.SequenceNode {
			return nil, d.wrongType(n, path, "a list")
		}
		out := make([]any, len(n.Content))
		for i, elem := range n.Content {
			elemPath := fmt.Sprintf("%s[%d]", path, i)
			d.lines[elemPath] = elem.Line
			v, err := d.singular(dealias(elem), fd, elemPath)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	return d.singular(n, fd, path)
}

// decimal is a quoted 64-bit integer as protojson writes one.
var decimal = regexp.MustCompile(`^-?[0-9]+$`)

// singular decodes one value (a field, list element or map value) of fd's
// type.
func (d *manifestDecoder) singular(n *yaml.Node, fd protoreflect.FieldDescriptor, path string) (any, error) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return d.message(n, fd.Message(), path)
	case protoreflect.EnumKind:
		return d.enum(n, fd.Enum(), path)
	case protoreflect.StringKind:
		if !hasTag(n, "!!str") {
			return nil, d.wrongType(n, path, "a string (quote it)")
		}
		return n.Value, nil
	case protoreflect.BoolKind:
		if !hasTag(n, "!!bool") {
			return nil, d.wrongType(n, path, "true or false")
		}
		var b bool
		return b, n.Decode(&b)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		bits := 64
		if fd.Kind() == protoreflect.Int32Kind || fd.Kind() == protoreflect.Sint32Kind || fd.Kind() == protoreflect.Sfixed32Kind {
			bits = 32
		}
		// A 64-bit integer may be the quoted decimal protojson (and so
		// `get -o yaml`) writes it as.
		quoted64 := bits == 64 && hasTag(n, "!!str") && decimal.MatchString(n.Value)
		if !hasTag(n, "!!int") && !quoted64 {
			return nil, d.wrongType(n, path, "an integer")
		}
		v, err := strconv.ParseInt(n.Value, 0, bits)
		if err != nil {
			return nil, d.errorAt(n.Line, path, "%s is not a %d-bit integer", n.Value, bits)
		}
		return v, nil
	}
	// No template field has another kind; protojson rejects what this passes.
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, d.errorAt(n.Line, path, "%v", err)
	}
	return v, nil
}

// enum accepts a value's full name (SNAPSHOT_SCOPE_FULL) or its name
// without the enum's prefix (FULL), in any case, with or without its
// underscores (OnFailure, as Kubernetes writes ON_FAILURE).
func (d *manifestDecoder) enum(n *yaml.Node, ed protoreflect.EnumDescriptor, path string) (any, error) {
	var short []string
	values := ed.Values()
	for i := 1; i < values.Len(); i++ { // the zero value means "unset"
		short = append(short, strings.TrimPrefix(string(values.Get(i).Name()), enum.Prefix(ed)))
	}
	want := "one of " + strings.Join(short, ", ")
	if !hasTag(n, "!!str") {
		return nil, d.wrongType(n, path, want)
	}
	name := strings.ToUpper(n.Value)
	for _, candidate := range []string{name, enum.Prefix(ed) + name} {
		if v := values.ByName(protoreflect.Name(candidate)); v != nil {
			return string(v.Name()), nil
		}
	}
	for i, s := range short {
		if strings.ReplaceAll(s, "_", "") == name {
			return string(values.Get(i + 1).Name()), nil
		}
	}
	return nil, d.errorAt(n.Line, path, "%q is not a valid %s (want %s)", n.Value, ed.Name(), want)
}

// knownFields lists what a manifest may set in md, for the unknown-field
// message.
func knownFields(md protoreflect.MessageDescriptor, path string) []string {
	var names []string
	fields := md.Fields()
	for i := range fields.Len() {
		name := fields.Get(i).JSONName()
		if !serverOwned[joinPath(path, name)] {
			names = append(names, name)
		}
	}
	return names
}

func joinPath(parent, field string) string {
	if parent == "" {
		return field
	}
	return parent + "." + field
}

// dealias follows YAML aliases (*name) to the anchored node.
func dealias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return hasTag(n, "!!null") }

func hasTag(n *yaml.Node, tag string) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == tag }

func nodeDescription(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("the string %q", n.Value)
	case "!!null":
		return "null"
	case "!!int", "!!float":
		return "the number " + n.Value
	case "!!bool":
		return n.Value
	}
	return fmt.Sprintf("%s %s", n.ShortTag(), n.Value)
}

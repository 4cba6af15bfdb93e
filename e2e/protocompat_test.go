package e2e

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/torpor-dev/torpor/api/gen/torpor/v1" // registers the descriptors compared
	"github.com/torpor-dev/torpor/internal/runtime/runtimetest"
)

var (
	protoBlock = regexp.MustCompile(`^\s*(message|enum|oneof) (\w+) \{`)
	protoField = regexp.MustCompile(`^\s*(?:repeated |optional )?(map<[^>]+>|[\w.]+) (\w+) = (\d+)`)
	protoValue = regexp.MustCompile(`^\s*(\w+) = (\d+)`)
)

// TestProtoFieldsKept: every message field and enum value of
// previousVersion's API (records in the store, RPCs between server, nodes
// and routers) is still there under its number, with its name and type,
// so the two versions read each other's bytes during an upgrade
// (docs/operations.md, "Upgrades"). A field removed, renumbered or
// retyped fails it.
func TestProtoFieldsKept(t *testing.T) {
	root, err := runtimetest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-tree", "--name-only", previousVersion, "api/torpor/v1/").CombinedOutput()
	if err != nil {
		t.Fatalf("git ls-tree %s (a shallow clone? fetch the full history): %v %s", previousVersion, err, out)
	}
	checked := 0
	for _, file := range strings.Fields(string(out)) {
		if !strings.HasSuffix(file, ".proto") {
			continue
		}
		src, err := exec.Command("git", "-C", root, "show", previousVersion+":"+file).Output()
		if err != nil {
			t.Fatalf("git show %s:%s: %v", previousVersion, file, err)
		}
		checked += checkProtoKept(t, file, string(src))
	}
	if checked < 100 {
		t.Fatalf("%d fields and values of %s compared, want the whole API", checked, previousVersion)
	}
}

// checkProtoKept compares the fields and enum values declared in src with
// the registered descriptors and returns how many it compared.
func checkProtoKept(t *testing.T, file, src string) int {
	t.Helper()
	type block struct{ kind, name string }
	var stack []block
	scope := func() (kind, name string) {
		var names []string
		for _, b := range stack {
			if b.kind != "oneof" {
				kind = b.kind
				names = append(names, b.name)
			}
		}
		return kind, "torpor.v1." + strings.Join(names, ".")
	}
	checked := 0
	for i, line := range strings.Split(src, "\n") {
		line, _, _ = strings.Cut(line, "//")
		where := file + ":" + strconv.Itoa(i+1)
		if m := protoBlock.FindStringSubmatch(line); m != nil {
			if !strings.Contains(line, "}") { // not an empty one: message X {}
				stack = append(stack, block{m[1], m[2]})
			}
			continue
		}
		if strings.TrimSpace(line) == "}" && len(stack) > 0 {
			stack = stack[:len(stack)-1]
			continue
		}
		kind, name := scope()
		desc, _ := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		switch kind {
		case "message":
			m := protoField.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			checked++
			md, ok := desc.(protoreflect.MessageDescriptor)
			if !ok {
				t.Errorf("%s: message %s is gone", where, name)
				continue
			}
			num, _ := strconv.Atoi(m[3])
			fd := md.Fields().ByNumber(protoreflect.FieldNumber(num))
			if fd == nil || string(fd.Name()) != m[2] || protoType(fd) != protoTypeName(m[1]) {
				t.Errorf("%s: %s field %d was %s %s, is %v", where, name, num, m[1], m[2], fd)
			}
		case "enum":
			m := protoValue.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			checked++
			ed, ok := desc.(protoreflect.EnumDescriptor)
			if !ok {
				t.Errorf("%s: enum %s is gone", where, name)
				continue
			}
			num, _ := strconv.Atoi(m[2])
			if v := ed.Values().ByNumber(protoreflect.EnumNumber(num)); v == nil || string(v.Name()) != m[1] {
				t.Errorf("%s: %s value %d was %s, is %v", where, name, num, m[1], v)
			}
		}
	}
	return checked
}

// protoType is a field's type as a .proto file names it, without the
// package: the message or enum name, else the scalar kind; map for maps.
func protoType(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		return "map"
	case fd.Message() != nil:
		return string(fd.Message().Name())
	case fd.Enum() != nil:
		return string(fd.Enum().Name())
	}
	return fd.Kind().String()
}

// protoTypeName is a declared type the way protoType names it.
func protoTypeName(declared string) string {
	if strings.HasPrefix(declared, "map<") {
		return "map"
	}
	return declared[strings.LastIndex(declared, ".")+1:]
}

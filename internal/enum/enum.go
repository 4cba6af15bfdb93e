// Package enum names protobuf enum values the way users see them: without
// the type prefix the values carry by convention (RUNNING, not
// ACTOR_STATE_RUNNING), in messages, logs and the CLI alike.
package enum

import (
	"fmt"
	"strings"
	"unicode"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Name is e's value name without its type prefix; a number the enum does
// not define shows as that number.
func Name(e protoreflect.Enum) string {
	v := e.Descriptor().Values().ByNumber(e.Number())
	if v == nil {
		return fmt.Sprint(e.Number())
	}
	return strings.TrimPrefix(string(v.Name()), Prefix(e.Descriptor()))
}

// Prefix is the prefix the value names of an enum carry by convention
// (VolumeKind → VOLUME_KIND_).
func Prefix(e protoreflect.EnumDescriptor) string {
	return upperSnake(string(e.Name())) + "_"
}

// upperSnake turns a CamelCase name into UPPER_SNAKE, keeping acronyms
// together: SnapshotScope → SNAPSHOT_SCOPE, HTTPGetAction → HTTP_GET_ACTION.
func upperSnake(name string) string {
	runes := []rune(name)
	var b strings.Builder
	for i, r := range runes {
		if i > 0 && unicode.IsUpper(r) {
			prevLower := unicode.IsLower(runes[i-1]) || unicode.IsDigit(runes[i-1])
			acronymEnds := unicode.IsUpper(runes[i-1]) && i+1 < len(runes) && unicode.IsLower(runes[i+1])
			if prevLower || acronymEnds {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

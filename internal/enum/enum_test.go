package enum

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestUpperSnake(t *testing.T) {
	for in, want := range map[string]string{
		"VolumeKind":    "VOLUME_KIND",
		"FromData":      "FROM_DATA",
		"HTTPGetAction": "HTTP_GET_ACTION",
		"Scope2Name":    "SCOPE2_NAME",
		"State":         "STATE",
	} {
		if got := upperSnake(in); got != want {
			t.Errorf("upperSnake(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestName(t *testing.T) {
	for _, tt := range []struct {
		e    protoreflect.Enum
		want string
	}{
		{torporv1.ActorState_ACTOR_STATE_RUNNING, "RUNNING"},
		{torporv1.ActorState_ACTOR_STATE_UNSPECIFIED, "UNSPECIFIED"},
		{torporv1.SnapshotScope_SNAPSHOT_SCOPE_FULL, "FULL"},
		{torporv1.RestoreScope_RESTORE_SCOPE_DATA_ON_GOLDEN, "DATA_ON_GOLDEN"},
		{torporv1.ActorState(99), "99"},
	} {
		if got := Name(tt.e); got != tt.want {
			t.Errorf("Name(%v) = %q, want %q", tt.e, got, tt.want)
		}
	}
}

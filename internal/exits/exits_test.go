package exits

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

func TestDescribe(t *testing.T) {
	at := time.Now()
	for _, tc := range []struct {
		exit *torporv1.ContainerExit
		want string
	}{
		{New("app", 3, []string{"bye"}, at), "container app exited with status 3: bye"},
		{New("app", 1, []string{"a", "b"}, at), "container app exited with status 1: a | b"},
		{New("app", 0, nil, at), "container app exited with status 0 (no output)"},
		{New("web", 137, []string{"x"}, at), "container web was killed by SIGKILL (status 137): x"},
		{New("web", 143, nil, at), "container web was killed by SIGTERM (status 143) (no output)"},
		{Unknown("app", []string{"x"}, at), "container app exited (its status is unknown: the sandbox ended before it could be read): x"},
	} {
		if got := Describe(tc.exit); got != tc.want {
			t.Errorf("Describe = %q, want %q", got, tc.want)
		}
	}
}

// TestErrorCarriesExit: the exit survives wrapping and a trip through a
// status error's details, as between node, control plane and router.
func TestErrorCarriesExit(t *testing.T) {
	detail := &torporv1.WorkloadExited{Exit: New("app", 1, []string{"fatal"}, time.Now()), NextRestartTime: timestamppb.Now()}
	err := fmt.Errorf("resume: %w", Error(connect.CodeUnavailable, "actor a/b exited", detail))
	if got := Of(err); !proto.Equal(got, detail) {
		t.Fatalf("Of = %v, want %v", got, detail)
	}
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("code %s, want unavailable", connect.CodeOf(err))
	}
	if Of(errors.New("plain")) != nil || Of(connect.NewError(connect.CodeInternal, errors.New("x"))) != nil {
		t.Fatal("Of found an exit in an error without one")
	}
}

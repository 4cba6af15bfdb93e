package envd

import (
	"bytes"
	"strings"
	"testing"
)

// TestSuperviseExitsAsItsChild: the supervisor ends with its child's exit
// status, 128+N for a signal N, and says why it does not serve (no
// config here: it serves nothing, so the test binds no port).
func TestSuperviseExitsAsItsChild(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 7", 7},
		{"kill -TERM $$", 128 + 15},
	} {
		t.Run(tc.script, func(t *testing.T) {
			var stderr bytes.Buffer
			if got := Main([]string{initArg, "--", "/bin/sh", "-c", tc.script}, nil, &stderr); got != tc.want {
				t.Fatalf("exit status %d, want %d (stderr %q)", got, tc.want, stderr.String())
			}
		})
	}
	var stderr bytes.Buffer
	if got := Main([]string{initArg, "--", "/no/such/program"}, nil, &stderr); got != 127 || !strings.Contains(stderr.String(), "/no/such/program") {
		t.Fatalf("a missing program: exit %d, stderr %q; want 127 naming it", got, stderr.String())
	}
}

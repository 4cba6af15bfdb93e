package kubetest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestServeStartsAgainOnALostPort runs serve on shell scripts that play a
// program losing its port (exiting with the kernel's message) on some of
// its starts, and healthy once it is up (it creates a file that the
// health endpoint checks).
func TestServeStartsAgainOnALostPort(t *testing.T) {
	const lost = `echo "listen tcp 127.0.0.1:$1: bind: address already in use"; exit 1`
	for _, tc := range []struct {
		name string
		// script is run with the program's port and its attempt as $1, $2.
		script     string
		wantStarts int
		wantErr    string // empty: healthy
	}{
		{"healthy at once", `touch up; exec sleep 60`, 1, ""},
		{"lost once", `if [ "$2" = 1 ]; then ` + lost + `; fi; touch up; exec sleep 60`, 2, ""},
		{"always lost", lost, portAttempts, "address already in use"},
		{"another failure is not retried", `echo "no such flag"; exit 2`, 1, "no such flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := &Cluster{t: t, dir: dir, spawner: newSpawner()}
			t.Cleanup(c.Stop)
			health := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if _, err := os.Stat(filepath.Join(dir, "up")); err != nil {
					http.Error(w, "not up", http.StatusServiceUnavailable)
				}
			}))
			defer health.Close()

			starts := 0
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := c.serve(ctx, program{
				name: "script", bin: "/bin/sh", ports: 1, client: health.Client(),
				args: func(ports []string) []string {
					starts++
					return []string{"-c", "cd " + dir + " && " + tc.script, "script", ports[0], strconv.Itoa(starts)}
				},
				health: func([]string) string { return health.URL },
			})
			if starts != tc.wantStarts {
				t.Errorf("started %d times, want %d", starts, tc.wantStarts)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("serve: %v", err)
			case tc.wantErr != "":
				var exited *exitError
				if !errors.As(err, &exited) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("serve: err = %v, want the program's exit with %q", err, tc.wantErr)
				}
			}
		})
	}
}

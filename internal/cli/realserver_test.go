package cli

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/server"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/store"
)

// TestAgainstRealServer drives the control plane (SQLite store) through
// the command line, so the client and the server agree on the API's
// meaning, not only its shape.
func TestAgainstRealServer(t *testing.T) {
	isolate(t)
	ctx := context.Background()
	data := t.TempDir()
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(data, "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	objects, err := snapshot.NewDirStore(filepath.Join(data, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(server.New(st, objects, server.Options{Logger: slog.New(slog.DiscardHandler)}).Handler())
	t.Cleanup(srv.Close)
	url := srv.URL

	dir, pinned := imageDir(t)
	file := filepath.Join(dir, "counter.yaml")
	if err := os.WriteFile(file, []byte(goodTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	equalText(t, "apply", ok(t, url, "template", "apply", "-f", file), "template/counter created\n")
	equalText(t, "apply again", ok(t, url, "template", "apply", "-f", file), "template/counter unchanged\n")
	var tmpl torporv1.Template
	decodeAs(t, formatJSON, ok(t, url, "template", "get", "counter", "-o", "json"), &tmpl)
	if got := tmpl.GetSpec().GetContainers()[0].GetImage(); got != pinned {
		t.Errorf("stored image %q, want %q", got, pinned)
	}
	changed := filepath.Join(dir, "changed.yaml")
	if err := os.WriteFile(changed, []byte(strings.Replace(goodTemplate, "keep: 3", "keep: 4", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if msg := fails(t, url, "template", "apply", "-f", changed); !strings.HasPrefix(msg, "Error: already_exists: ") {
		t.Errorf("changed template: %q", msg)
	}

	equalText(t, "create actor", ok(t, url, "actor", "create", "c1", "--template", "counter", "--selector", "pool=small"), "actor/c1 created\n")
	if msg := fails(t, url, "actor", "create", "c2", "--template", "missing"); !strings.HasPrefix(msg, "Error: ") || !strings.Contains(msg, "missing") {
		t.Errorf("actor of a missing template: %q", msg)
	}
	equalText(t, "update", ok(t, url, "actor", "update", "c1", "--selector", "pool=big,zone=z1"), "actor/c1 updated\n")
	var actor torporv1.Actor
	decodeAs(t, formatYAML, ok(t, url, "actor", "get", "c1", "-o", "yaml"), &actor)
	if actor.GetMetadata().GetVersion() < 2 || len(actor.GetSpec().GetWorkerSelector()) != 2 || actor.GetSpec().GetWorkerSelector()["zone"] != "z1" {
		t.Errorf("after update: %v", &actor)
	}
	list := ok(t, url, "actor", "list")
	if lines := strings.Split(strings.TrimSpace(list), "\n"); len(lines) != 2 ||
		strings.Join(strings.Fields(lines[0]), " ") != "NAME TEMPLATE STATE WORKER AGE" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "c1 counter SUSPENDED <none> ") {
		t.Errorf("actor list:\n%s", list)
	}

	equalText(t, "delete actor", ok(t, url, "actor", "delete", "c1"), "actor/c1 deleted\n")
	if msg := fails(t, url, "actor", "get", "c1"); !strings.HasPrefix(msg, "Error: not_found: ") {
		t.Errorf("deleted actor: %q", msg)
	}
	equalText(t, "delete template", ok(t, url, "template", "delete", "counter"), "template/counter deleted\n")
}

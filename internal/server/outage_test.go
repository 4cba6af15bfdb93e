package server

import (
	"context"
	"io"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// TestStoreOutageIsUnavailable: while the database is down for longer
// than the store rides out, calls answer Unavailable (retry), both where
// the service reads the store and where the gate checks an API token
// there; once it is back, the same calls succeed.
func TestStoreOutageIsUnavailable(t *testing.T) {
	pg := storetest.StartPostgres(t)
	r := startReplica(t, pg.URL(), io.Discard)
	admin := r.clients(r.admin(t))
	user := r.clients(testClient(t, r.roots, nil, r.apiToken(t, "default")))
	get := func(c clients) error {
		_, err := c.actors.GetActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: "default", Name: "absent"}))
		return err
	}

	pg.Stop(t)
	callers := map[string]clients{"admin token": admin, "API token": user}
	errs := make(map[string]chan error)
	for name, c := range callers {
		errs[name] = make(chan error, 1)
		go func() {
			errs[name] <- get(c)
		}()
	}
	for name, ch := range errs {
		err := <-ch
		if code := connect.CodeOf(err); code != connect.CodeUnavailable {
			t.Errorf("%s: get actor while the store is down: %v (%v), want unavailable", name, code, err)
		}
	}
	if t.Failed() {
		return
	}

	pg.Start(t)
	for name, c := range callers {
		if err := get(c); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%s: get an absent actor once the store is back: %v, want not found", name, err)
		}
	}
}

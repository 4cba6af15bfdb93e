package router

import (
	"net/http"
	"testing"

	"github.com/torpor-dev/torpor/internal/validate"
)

// FuzzActorOf: whatever Host and Torpor-Actor a client sends, the router
// finds a valid actor name and space or refuses, and a key it found is the
// one its canonical host name and header give back. The seed corpus is in
// testdata/fuzz/FuzzActorOf.
func FuzzActorOf(f *testing.F) {
	for _, seed := range [][2]string{
		{"app.default.actors.localhost", ""},
		{"App.Default.actors.localhost.:8080", ""},
		{"localhost", "default/app"},
		{"a.actors.localhost", ""},
		{"x.y.z.actors.localhost", " default/app "},
		{"[::1]:80", "nope"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, host, header string) {
		req := &http.Request{Host: host, Header: http.Header{}}
		if header != "" {
			req.Header.Set(ActorHeader, header)
		}
		key, err := actorOf(req, DefaultDomain)
		if err != nil {
			return
		}
		if validate.Name("space", key.Space) != nil || validate.Name("actor", key.Name) != nil {
			t.Fatalf("host %q, header %q: invalid key %q accepted", host, header, key)
		}
		if again, err := actorFromHost(key.Name+"."+key.Space+"."+DefaultDomain, DefaultDomain); err != nil || again != key {
			t.Fatalf("host %q, header %q: key %q; its host name gives %q, %v", host, header, key, again, err)
		}
		if again, err := actorFromHeader(key.String()); err != nil || again != key {
			t.Fatalf("host %q, header %q: key %q; its header gives %q, %v", host, header, key, again, err)
		}
	})
}

package router

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/torpor-dev/torpor/internal/validate"
)

// FuzzActorOf: whatever Host, Torpor-Actor and E2b-Sandbox-Id/-Port a
// client sends, the router finds a valid actor name and space, or a valid
// sandbox ID and port, or refuses; what it found is what its canonical
// host name and headers give back, and a host is never both an actor's and
// a sandbox's. The seed corpus is in testdata/fuzz/FuzzActorOf.
func FuzzActorOf(f *testing.F) {
	for _, seed := range [][2]string{
		{"app.default.actors.localhost", ""},
		{"App.Default.actors.localhost.:8080", ""},
		{"localhost", "default/app"},
		{"a.actors.localhost", ""},
		{"x.y.z.actors.localhost", " default/app "},
		{"[::1]:80", "nope"},
		{"49983-abc.actors.localhost", ""},
		{"8000-abc.default.actors.localhost", ""},
		{"080-abc.actors.localhost:7443", ""},
	} {
		f.Add(seed[0], seed[1], "", "")
	}
	f.Add("127.0.0.1:7443", "", "abc", "49983")
	f.Add("8000-x.actors.localhost", "default/app", "abc", "0049983")
	f.Fuzz(func(t *testing.T, host, header, sandboxID, sandboxPort string) {
		req := &http.Request{Host: host, Header: http.Header{}}
		if header != "" {
			req.Header.Set(ActorHeader, header)
		}
		if sandboxID != "" {
			req.Header.Set(SandboxIDHeader, sandboxID)
		}
		if sandboxPort != "" {
			req.Header.Set(SandboxPortHeader, sandboxPort)
		}
		addr, err := addressOf(req, DefaultDomain)
		if err != nil {
			return
		}
		if addr.sandbox != "" {
			if addr.actor != (ActorKey{}) || validate.SandboxID("id", addr.sandbox) != nil || addr.port < 1 || addr.port > 65535 {
				t.Fatalf("host %q, headers %q %q %q: invalid sandbox address %+v accepted", host, header, sandboxID, sandboxPort, addr)
			}
			canonical := strconv.Itoa(addr.port) + "-" + addr.sandbox + "." + DefaultDomain
			if again, err := addressFromHost(canonical, DefaultDomain); err != nil || again != addr {
				t.Fatalf("host %q, headers %q %q %q: %+v; its host name gives %+v, %v", host, header, sandboxID, sandboxPort, addr, again, err)
			}
			if again, err := sandboxFromHeaders(addr.sandbox, strconv.Itoa(addr.port)); err != nil || again != addr {
				t.Fatalf("host %q, headers %q %q %q: %+v; its headers give %+v, %v", host, header, sandboxID, sandboxPort, addr, again, err)
			}
			if _, err := actorFromHost(canonical, DefaultDomain); err == nil {
				t.Fatalf("sandbox host %q is also an actor host", canonical)
			}
			return
		}
		key := addr.actor
		if again, err := addressFromHost(key.Name+"."+key.Space+"."+DefaultDomain, DefaultDomain); err != nil || again.sandbox != "" {
			t.Fatalf("host %q, header %q: key %q; its host name gives %+v, %v", host, header, key, again, err)
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

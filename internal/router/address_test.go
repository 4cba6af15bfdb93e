package router

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestAddressOf(t *testing.T) {
	tests := []struct {
		name   string
		host   string
		header string
		// sandboxID and sandboxPort are the E2b-Sandbox-Id and
		// E2b-Sandbox-Port headers, when set.
		sandboxID, sandboxPort string
		domain                 string
		want                   ActorKey
		// wantSandbox and wantPort: the request is for that sandbox's port.
		wantSandbox string
		wantPort    int
		wantErr     string // substring; "" means success
		noActor     bool   // want errNoActor
	}{
		{name: "host", host: "counter.default.actors.localhost", want: ActorKey{"default", "counter"}},
		{name: "host with port", host: "counter.team-a.actors.localhost:8080", want: ActorKey{"team-a", "counter"}},
		{name: "host case and trailing dot", host: "Counter.Default.Actors.Localhost.", want: ActorKey{"default", "counter"}},
		{name: "custom domain", host: "a1.s1.example.com", domain: "example.com", want: ActorKey{"s1", "a1"}},
		{name: "header", host: "127.0.0.1:8080", header: "s1/a1", want: ActorKey{"s1", "a1"}},
		{name: "header wins over host", host: "counter.default.actors.localhost", header: "other/b", want: ActorKey{"other", "b"}},
		{name: "header without slash", header: "counter", wantErr: `header Torpor-Actor: "counter" is not <space>/<actor>`},
		{name: "header bad actor", header: "default/Bad_Name", wantErr: "header Torpor-Actor actor"},
		{name: "header empty space", header: "/a", wantErr: "header Torpor-Actor space: required"},
		{name: "host without space", host: "counter.actors.localhost", wantErr: "want <actor>.<space>.actors.localhost"},
		{name: "host with extra label", host: "x.counter.default.actors.localhost", wantErr: "want <actor>.<space>.actors.localhost"},
		{name: "host bad label", host: "-a.default.actors.localhost", wantErr: "is not a DNS-1123 label"},
		{name: "ip host", host: "127.0.0.1:8080", noActor: true},
		{name: "other domain", host: "counter.default.example.com", noActor: true},
		{name: "domain itself", host: "actors.localhost", noActor: true},
		{name: "sandbox host", host: "49983-i3k2abc.actors.localhost", wantSandbox: "i3k2abc", wantPort: 49983},
		{name: "sandbox host with port, case, dot", host: "8000-ABC1.Actors.Localhost.:7443", wantSandbox: "abc1", wantPort: 8000},
		{name: "sandbox host with a domain carrying a port", host: "1-x.example.com:7080", domain: "example.com", wantSandbox: "x", wantPort: 1},
		{name: "sandbox host highest port", host: "65535-x.actors.localhost", wantSandbox: "x", wantPort: 65535},
		{name: "sandbox host port 0", host: "0-abc.actors.localhost", wantErr: `host 0-abc.actors.localhost port: "0" is not a port`},
		{name: "sandbox host port too high", host: "65536-abc.actors.localhost", wantErr: `"65536" is not a port`},
		{name: "sandbox host leading zero", host: "080-abc.actors.localhost", wantErr: `"080" is not a port`},
		{name: "sandbox host no port", host: "-abc.actors.localhost", wantErr: `host -abc.actors.localhost port: required`},
		{name: "sandbox host not digits", host: "http-abc.actors.localhost", wantErr: `"http" is not a port`},
		{name: "sandbox host id with dash", host: "8000-ab-c.actors.localhost", wantErr: "host 8000-ab-c.actors.localhost sandbox id"},
		{name: "sandbox host no id", host: "8000-.actors.localhost", wantErr: "sandbox id: required"},
		// An actor named like a sandbox host, in a space: two labels, so
		// always an actor.
		{name: "actor named like a sandbox host", host: "8000-abc.default.actors.localhost", want: ActorKey{"default", "8000-abc"}},
		{name: "sandbox headers", host: "127.0.0.1:7443", sandboxID: "abc", sandboxPort: "49983", wantSandbox: "abc", wantPort: 49983},
		{name: "sandbox headers win over host", host: "8000-other.actors.localhost", sandboxID: "abc", sandboxPort: "3000", wantSandbox: "abc", wantPort: 3000},
		{name: "sandbox headers win over actor header", header: "s1/a1", sandboxID: "abc", sandboxPort: "3000", wantSandbox: "abc", wantPort: 3000},
		{name: "sandbox header without port", sandboxID: "abc", wantErr: "header E2b-Sandbox-Port: required"},
		{name: "sandbox port header without id", sandboxPort: "80", wantErr: "header E2b-Sandbox-Id: required"},
		{name: "sandbox header bad id", sandboxID: "a_b", sandboxPort: "80", wantErr: "header E2b-Sandbox-Id"},
		{name: "sandbox header bad port", sandboxID: "abc", sandboxPort: "99999", wantErr: `header E2b-Sandbox-Port: "99999" is not a port`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			domain := DefaultDomain
			if tt.domain != "" {
				domain = tt.domain
			}
			req, err := http.NewRequest(http.MethodGet, "http://ignored/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = tt.host
			if tt.header != "" {
				req.Header.Set(ActorHeader, tt.header)
			}
			if tt.sandboxID != "" {
				req.Header.Set(SandboxIDHeader, tt.sandboxID)
			}
			if tt.sandboxPort != "" {
				req.Header.Set(SandboxPortHeader, tt.sandboxPort)
			}
			got, err := addressOf(req, domain)
			want := address{actor: tt.want, sandbox: tt.wantSandbox, port: tt.wantPort}
			switch {
			case tt.noActor:
				if !errors.Is(err, errNoActor) {
					t.Fatalf("want errNoActor, got %v (%v)", err, got)
				}
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("want error containing %q, got %v (%v)", tt.wantErr, err, got)
				}
			case err != nil:
				t.Fatalf("unexpected error: %v", err)
			case got != want:
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestNormalizeDomain(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{in: "", want: DefaultDomain},
		{in: "Actors.Example.", want: "actors.example"},
		{in: ".actors.example", want: "actors.example"},
		{in: "bad_label.example", wantErr: "domain bad_label.example"},
	}
	for _, tt := range tests {
		got, err := normalizeDomain(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("normalizeDomain(%q): want error containing %q, got %q, %v", tt.in, tt.wantErr, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("normalizeDomain(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

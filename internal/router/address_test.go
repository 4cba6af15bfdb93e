package router

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestActorOf(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		header  string
		domain  string
		want    ActorKey
		wantErr string // substring; "" means success
		noActor bool   // want errNoActor
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
			got, err := actorOf(req, domain)
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
			case got != tt.want:
				t.Fatalf("got %v, want %v", got, tt.want)
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

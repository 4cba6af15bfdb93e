package router

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/internal/validate"
)

// ActorHeader names the actor a request is for, as "space/name". It wins
// over the Host header so clients that cannot choose the host name (or use
// an IP address) can still reach any actor.
const ActorHeader = "Torpor-Actor"

// DefaultDomain is the parent domain of actor host names. Browsers and most
// resolvers map every *.localhost name to the loopback address, so it works
// on one machine without any DNS setup. The client shows actor URLs under
// the same default.
const DefaultDomain = client.DefaultDomain

// ActorKey identifies an actor.
type ActorKey struct {
	Space string
	Name  string
}

func (k ActorKey) String() string { return k.Space + "/" + k.Name }

// errNoActor: the request is not addressed to any actor (neither header nor
// an actor host name), so it may be for the router itself.
var errNoActor = errors.New("request names no actor")

// actorOf picks the actor a request is addressed to: the Torpor-Actor
// header if present, else a Host of the form <actor>.<space>.<domain> (port
// ignored). It returns errNoActor when neither is there, and a message
// naming the header or host when one is there but malformed.
func actorOf(req *http.Request, domain string) (ActorKey, error) {
	if v := req.Header.Get(ActorHeader); v != "" {
		return actorFromHeader(v)
	}
	return actorFromHost(req.Host, domain)
}

func actorFromHeader(v string) (ActorKey, error) {
	space, name, ok := strings.Cut(strings.TrimSpace(v), "/")
	if !ok {
		return ActorKey{}, fmt.Errorf("header %s: %q is not <space>/<actor>", ActorHeader, v)
	}
	if err := validate.Name("header "+ActorHeader+" space", space); err != nil {
		return ActorKey{}, err
	}
	if err := validate.Name("header "+ActorHeader+" actor", name); err != nil {
		return ActorKey{}, err
	}
	return ActorKey{Space: space, Name: name}, nil
}

func actorFromHost(host, domain string) (ActorKey, error) {
	h := strings.ToLower(host)
	if hostOnly, _, err := net.SplitHostPort(h); err == nil {
		h = hostOnly
	}
	h = strings.TrimSuffix(h, ".") // a fully qualified name is the same host
	prefix, ok := strings.CutSuffix(h, "."+domain)
	if !ok {
		return ActorKey{}, errNoActor
	}
	name, space, ok := strings.Cut(prefix, ".")
	if !ok || strings.Contains(space, ".") {
		return ActorKey{}, fmt.Errorf("host %q: want <actor>.<space>.%s", host, domain)
	}
	if err := validate.Name("host "+host+" actor", name); err != nil {
		return ActorKey{}, err
	}
	if err := validate.Name("host "+host+" space", space); err != nil {
		return ActorKey{}, err
	}
	return ActorKey{Space: space, Name: name}, nil
}

// normalizeDomain accepts the domain as users type it ("Actors.Example.",
// ".actors.example") and returns the form host names are compared with.
func normalizeDomain(d string) (string, error) {
	d = strings.Trim(strings.ToLower(strings.TrimSpace(d)), ".")
	if d == "" {
		return DefaultDomain, nil
	}
	for label := range strings.SplitSeq(d, ".") {
		if err := validate.Name("domain "+d, label); err != nil {
			return "", err
		}
	}
	return d, nil
}

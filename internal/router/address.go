package router

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
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

// Headers the E2B SDK sends with every request to a sandbox: with
// E2B_SANDBOX_URL set it sends them to that URL (the router's own
// address), so they name the sandbox and its port instead of the host.
// They win over the Host header and over ActorHeader.
const (
	SandboxIDHeader   = "E2b-Sandbox-Id"
	SandboxPortHeader = "E2b-Sandbox-Port"
)

// errNoActor: the request is not addressed to any actor or sandbox
// (neither header nor an actor or sandbox host name), so it may be for the
// router itself.
var errNoActor = errors.New("request names no actor")

// address is what a request is for: an actor, or a port of an E2B
// sandbox. A sandbox is an actor too, but the ID names no space: only the
// control plane's sandbox index maps it to one (sandboxes.go).
type address struct {
	actor ActorKey
	// sandbox is the sandbox ID when the request is for a sandbox; port
	// is the port of it the request goes to.
	sandbox string
	port    int
}

// addressOf picks what a request is addressed to: the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers if present, else the Torpor-Actor header, else
// a Host of the form <port>-<sandbox id>.<domain> (one label before the
// domain) or <actor>.<space>.<domain> (two labels), the port of the Host
// ignored. The two host forms cannot be taken for each other: an actor
// host always has two labels before the domain, a sandbox host one. It
// returns errNoActor when nothing names an actor or a sandbox, and a
// message naming the header or host when one is there but malformed.
func addressOf(req *http.Request, domain string) (address, error) {
	if id, port := req.Header.Get(SandboxIDHeader), req.Header.Get(SandboxPortHeader); id != "" || port != "" {
		return sandboxFromHeaders(id, port)
	}
	if v := req.Header.Get(ActorHeader); v != "" {
		key, err := actorFromHeader(v)
		return address{actor: key}, err
	}
	return addressFromHost(req.Host, domain)
}

func sandboxFromHeaders(id, port string) (address, error) {
	id, port = strings.TrimSpace(id), strings.TrimSpace(port)
	if err := validate.SandboxID("header "+SandboxIDHeader, id); err != nil {
		return address{}, err
	}
	p, err := sandboxPort("header "+SandboxPortHeader, port)
	if err != nil {
		return address{}, err
	}
	return address{sandbox: id, port: p}, nil
}

// sandboxPort parses a port as the SDK writes it: decimal, 1 to 65535,
// without leading zeros (so each port has one host name).
func sandboxPort(path, s string) (int, error) {
	if s == "" {
		return 0, &validate.FieldError{Path: path, Reason: "required"}
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != s {
		return 0, &validate.FieldError{Path: path, Reason: fmt.Sprintf("%q is not a port (1 to 65535)", s)}
	}
	return p, nil
}

// addressFromHost reads a Host header: <port>-<sandbox id>.<domain> or
// <actor>.<space>.<domain>.
func addressFromHost(host, domain string) (address, error) {
	prefix, ok := hostPrefix(host, domain)
	if !ok {
		return address{}, errNoActor
	}
	if !strings.Contains(prefix, ".") {
		port, id, ok := strings.Cut(prefix, "-")
		if !ok {
			return address{}, fmt.Errorf("host %q: want <actor>.<space>.%s or <port>-<sandbox id>.%s", host, domain, domain)
		}
		p, err := sandboxPort("host "+host+" port", port)
		if err != nil {
			return address{}, err
		}
		if err := validate.SandboxID("host "+host+" sandbox id", id); err != nil {
			return address{}, err
		}
		return address{sandbox: id, port: p}, nil
	}
	key, err := actorFromPrefix(host, prefix, domain)
	return address{actor: key}, err
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
	prefix, ok := hostPrefix(host, domain)
	if !ok {
		return ActorKey{}, errNoActor
	}
	return actorFromPrefix(host, prefix, domain)
}

// hostPrefix is what comes before .<domain> in host (lower case, port and
// a trailing dot dropped); false when host is not under domain.
func hostPrefix(host, domain string) (string, bool) {
	h := strings.ToLower(host)
	if hostOnly, _, err := net.SplitHostPort(h); err == nil {
		h = hostOnly
	}
	h = strings.TrimSuffix(h, ".") // a fully qualified name is the same host
	return strings.CutSuffix(h, "."+domain)
}

// actorFromPrefix reads the <actor>.<space> before the domain of host.
func actorFromPrefix(host, prefix, domain string) (ActorKey, error) {
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

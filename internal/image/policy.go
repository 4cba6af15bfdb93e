package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"
)

// Policy says where images may come from: local images only under the
// directories it names, registries only by its allow list of host
// patterns, each reached with the credentials the administrator gave for
// it and nothing else (no Docker config, no environment). The server checks
// a template's images against its policy at apply and reads only what it
// allows; each node checks again, with its own, before it opens a file or
// dials a registry. Templates come from tenants, and the processes that
// read their images run as root next to the node's own files and
// networks.
//
// A nil Policy allows nothing.
type Policy struct {
	registries []hostPattern
	dirs       []string
	// auth is keyed by registry as name.Registry.RegistryStr spells it.
	auth      map[string]authn.AuthConfig
	transport http.RoundTripper
}

// PolicyConfig is what an administrator sets.
type PolicyConfig struct {
	// Registries are host patterns: HOST or HOST:PORT (without a port,
	// any port of HOST), *.DOMAIN (any host below DOMAIN) or * (any
	// host). A pattern with a '*' never reaches a loopback, private,
	// link-local (cloud metadata) or other non-public address, whatever
	// the name resolves to; a host named exactly may be one.
	Registries []string
	// Dirs are absolute directories local images (oci:PATH) may be read
	// from, with everything below them.
	Dirs []string
	// Auth holds credentials by registry host (HOST or HOST:PORT, as in
	// image references); each must be an allowed registry. Others are
	// reached anonymously.
	Auth map[string]authn.AuthConfig
}

type hostPattern struct {
	// host is lower case: a name or IP address, "*", or "*.domain".
	host string
	// port is empty for any port.
	port string
}

func (p hostPattern) String() string {
	if p.port == "" {
		return p.host
	}
	return net.JoinHostPort(p.host, p.port)
}

func (p hostPattern) wildcard() bool { return strings.HasPrefix(p.host, "*") }

func (p hostPattern) matches(host, port string) bool {
	if p.port != "" && p.port != port {
		return false
	}
	switch {
	case p.host == "*":
		return true
	case p.wildcard():
		return strings.HasSuffix(host, p.host[1:])
	}
	return p.host == host
}

// NewPolicy checks c and returns its policy.
func NewPolicy(c PolicyConfig) (*Policy, error) {
	p := &Policy{auth: map[string]authn.AuthConfig{}}
	for _, s := range c.Registries {
		hp, err := parseHostPattern(s)
		if err != nil {
			return nil, fmt.Errorf("allowed registry %q: %w", s, err)
		}
		p.registries = append(p.registries, hp)
	}
	for _, d := range c.Dirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("allowed image directory %q: not an absolute path", d)
		}
		p.dirs = append(p.dirs, filepath.Clean(d))
	}
	for host, cfg := range c.Auth {
		reg, err := name.NewRegistry(host, name.StrictValidation)
		if err != nil {
			return nil, fmt.Errorf("credentials for registry %q: %w", host, err)
		}
		if _, ok := p.allowedRegistry(reg.RegistryStr()); !ok {
			return nil, fmt.Errorf("credentials for registry %q: not an allowed registry", host)
		}
		p.auth[reg.RegistryStr()] = cfg
	}
	t := remote.DefaultTransport.(*http.Transport).Clone()
	// A proxy would dial on our behalf, past the address check.
	t.Proxy = nil
	t.DialContext = p.dial
	p.transport = t
	return p, nil
}

func parseHostPattern(s string) (hostPattern, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" || strings.ContainsAny(s, "/@ ") {
		return hostPattern{}, fmt.Errorf("want HOST, HOST:PORT, *.DOMAIN or *")
	}
	hp := hostPattern{host: s}
	if host, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return hostPattern{}, fmt.Errorf("port %q is not a port", port)
		}
		hp = hostPattern{host: host, port: port}
	}
	switch {
	case hp.host == "*":
	case strings.HasPrefix(hp.host, "*."):
		if strings.Contains(hp.host[2:], "*") || hp.host == "*." {
			return hostPattern{}, fmt.Errorf("a '*' stands only for a whole host or the labels before a domain (*.example.com)")
		}
	case strings.Contains(hp.host, "*"):
		return hostPattern{}, fmt.Errorf("a '*' stands only for a whole host or the labels before a domain (*.example.com)")
	case hp.host == "docker.io":
		// References to Docker Hub name it so.
		hp.host = name.DefaultRegistry
	}
	return hp, nil
}

// RefusedError says which rule of a Policy refuses an image reference.
type RefusedError struct {
	Ref  string
	Rule string
}

func (e *RefusedError) Error() string { return fmt.Sprintf("image %q: %s", e.Ref, e.Rule) }

// Check says whether the policy allows ref, without opening or dialing
// anything outside what it allows. The error is a *RefusedError naming the
// rule, or why ref is not a reference.
func (p *Policy) Check(ref string) error {
	if strings.HasPrefix(ref, LayoutScheme) {
		r, err := parseLayoutRef(ref, "")
		if err != nil {
			return err
		}
		// A path that resolves to nothing opens nothing: whoever opens
		// it says it cannot be read.
		if _, err := p.localPath(ref, r.path); err != nil && !errors.Is(err, errUnresolved) {
			return err
		}
		return nil
	}
	parsed, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("image %q: %w", ref, err)
	}
	return p.checkRegistry(ref, parsed.Context().Registry)
}

func (p *Policy) checkRegistry(ref string, reg name.Registry) error {
	if p == nil || len(p.registries) == 0 {
		return &RefusedError{ref, fmt.Sprintf("registry %s is not allowed: this installation allows no registry (an administrator allows one with --allow-registry)", reg.RegistryStr())}
	}
	pattern, ok := p.allowedRegistry(reg.RegistryStr())
	if !ok {
		return &RefusedError{ref, fmt.Sprintf("registry %s is not allowed (allowed: %s)", reg.RegistryStr(), p.registryList())}
	}
	if pattern.wildcard() {
		host, _ := splitHostPort(reg.RegistryStr())
		if why := nonPublicHost(host); why != "" {
			return &RefusedError{ref, fmt.Sprintf("registry %s is %s: allowed only when named exactly (--allow-registry %s), not by %s", reg.RegistryStr(), why, reg.RegistryStr(), pattern)}
		}
	}
	return nil
}

// allowedRegistry returns the pattern that allows registry (HOST or
// HOST:PORT), preferring one that names it exactly.
func (p *Policy) allowedRegistry(registry string) (hostPattern, bool) {
	host, port := splitHostPort(registry)
	var found *hostPattern
	for i, pat := range p.registries {
		if !pat.matches(host, port) {
			continue
		}
		if !pat.wildcard() {
			return pat, true
		}
		if found == nil {
			found = &p.registries[i]
		}
	}
	if found == nil {
		return hostPattern{}, false
	}
	return *found, true
}

func (p *Policy) registryList() string {
	var s []string
	for _, r := range p.registries {
		s = append(s, r.String())
	}
	return strings.Join(s, ", ")
}

// splitHostPort splits HOST[:PORT] (IPv6 in brackets), lower-casing HOST.
func splitHostPort(hostport string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return strings.ToLower(h), p
	}
	return strings.ToLower(strings.Trim(hostport, "[]")), ""
}

// nonPublicHost says what kind of non-public address host is, by its name
// alone: an IP address or a localhost name. Other names are checked as
// they are dialed.
func nonPublicHost(host string) string {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return "a loopback address"
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		return nonPublic(addr)
	}
	return ""
}

// sharedAddressSpace is RFC 6598's carrier-grade NAT range, where some
// clouds keep their metadata service.
var sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")

// nonPublic says what kind of address addr is when it is not a public
// unicast address, or "".
func nonPublic(addr netip.Addr) string {
	addr = addr.Unmap()
	switch {
	case addr.IsLoopback():
		return "a loopback address"
	case addr.IsLinkLocalUnicast():
		return "a link-local address (where cloud metadata services answer)"
	case addr.IsPrivate() || sharedAddressSpace.Contains(addr):
		return "a private address"
	case addr.IsUnspecified() || addr.IsMulticast() || addr.IsInterfaceLocalMulticast() || addr.IsLinkLocalMulticast() ||
		(addr.Is4() && addr.As4()[0] == 0):
		return "not a unicast address"
	}
	return ""
}

// dial connects to a registry (or where it redirects to). A host some
// pattern names exactly may be at any address; any other host only at a
// public one, checked on the address actually dialed, so neither a name
// resolving to 127.0.0.1 nor a redirect reaches the node's own services.
func (p *Policy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port := splitHostPort(addr)
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	exact := slices.ContainsFunc(p.registries, func(pat hostPattern) bool { return !pat.wildcard() && pat.matches(host, port) })
	if !exact {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("dial %s: %w", addr, err)
			}
			if why := nonPublic(ap.Addr()); why != "" {
				return fmt.Errorf("dial %s: %s is %s, reached only when its registry is allowed by its exact name", addr, ap.Addr(), why)
			}
			return nil
		}
	}
	return d.DialContext(ctx, network, addr)
}

// localPath returns the path to open for a local image at path (absolute):
// it and the file it resolves to must lie in an allowed directory. A path
// outside is refused without being looked at.
func (p *Policy) localPath(ref, path string) (string, error) {
	if p == nil || len(p.dirs) == 0 {
		return "", &RefusedError{ref, "local images are not allowed: this installation allows no image directory (an administrator allows one with --allow-image-dir)"}
	}
	refused := &RefusedError{ref, fmt.Sprintf("local image %s is outside the allowed image directories (%s)", path, strings.Join(p.dirs, ", "))}
	if !slices.ContainsFunc(p.dirs, func(d string) bool { return within(path, d) }) {
		return "", refused
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		// Not the resolution's error: it would name where a link leads.
		return "", fmt.Errorf("image %q: local image %s %w", ref, path, errUnresolved)
	}
	for _, d := range p.dirs {
		if realDir, err := filepath.EvalSymlinks(d); err == nil && within(real, realDir) {
			return real, nil
		}
	}
	return "", refused
}

// errUnresolved is a local image path that does not resolve to a file.
var errUnresolved = errors.New("cannot be read")

// within reports whether path is dir or below it (both clean).
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, string(filepath.Separator))+string(filepath.Separator))
}

// remoteOptions are how p reaches the registry of ref.
func (p *Policy) remoteOptions(ref name.Reference) []remote.Option {
	auth := authn.Anonymous
	if cfg, ok := p.auth[ref.Context().Registry.RegistryStr()]; ok {
		auth = authn.FromConfig(cfg)
	}
	return []remote.Option{remote.WithAuth(auth), remote.WithTransport(p.transport)}
}

// registryAuthEntry is one registry's credentials in a registry auth file:
// a user name and password, or a token sent as is (Bearer).
type registryAuthEntry struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Token    string `json:"token,omitempty"`
}

// LoadRegistryAuth reads a registry auth file: YAML (or JSON) mapping a
// registry host (HOST or HOST:PORT, as in image references) to
// {username, password} or {token}. It holds secrets, so it must not be
// readable by group or others.
func LoadRegistryAuth(path string) (map[string]authn.AuthConfig, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("registry auth file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("registry auth file %s: mode %04o lets others read it (chmod 600)", path, fi.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("registry auth file: %w", err)
	}
	var entries map[string]registryAuthEntry
	if err := yaml.UnmarshalStrict(raw, &entries); err != nil {
		return nil, fmt.Errorf("registry auth file %s: %w", path, err)
	}
	auth := make(map[string]authn.AuthConfig, len(entries))
	for host, e := range entries {
		switch {
		case e.Token != "" && e.Username == "" && e.Password == "":
			auth[host] = authn.AuthConfig{RegistryToken: e.Token}
		case e.Token == "" && e.Username != "" && e.Password != "":
			auth[host] = authn.AuthConfig{Username: e.Username, Password: e.Password}
		default:
			return nil, fmt.Errorf("registry auth file %s: %s: want username and password, or token", path, host)
		}
	}
	return auth, nil
}

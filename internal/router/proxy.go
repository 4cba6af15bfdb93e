package router

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/internal/slotgate"
	"github.com/torpor-dev/torpor/internal/tracing"
)

// proxy forwards requests to workloads over one pool of keep-alive
// connections.
type proxy struct {
	rp *httputil.ReverseProxy
}

// proxyTarget is where one proxy attempt goes and what it reports.
type proxyTarget struct {
	actor ActorKey
	at    placement
	// activationStart, when set, is when the request for a non-running
	// actor arrived; the first response byte observes activation.
	activationStart time.Time
	activation      prometheus.Observer
}

type proxyOutcome int

// Outcomes of a proxy attempt that did not answer leave the answer to the
// caller: nothing was written to the client.
const (
	proxied     proxyOutcome = iota // the workload answered, or the client left
	refused                         // nothing sent: the slot gate refused a stale placement
	gateDown                        // nothing sent: the slot gate did not answer (errGateDown)
	unreachable                     // nothing sent: nothing accepts connections on the port
	cut                             // the request may have reached the workload, which did not answer
	unanswered                      // the client left before an answer
)

// attempt is one proxy attempt's state, carried in the outgoing request's
// context to the ReverseProxy callbacks.
type attempt struct {
	target  proxyTarget
	outcome proxyOutcome
	err     error // why the workload did not answer
}

type attemptKey struct{}

func newProxy(log *slog.Logger, dialer *net.Dialer) *proxy {
	transport := &http.Transport{
		// Every connection goes through the slot gate of the actor's node
		// and carries the actor's uid; the pool is keyed by placement
		// (Rewrite), so a connection admitted for one actor never serves
		// a request for another.
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			a := ctx.Value(attemptKey{}).(*attempt)
			conn, err := slotgate.Dial(ctx, dialer, a.target.at.target)
			if gateDownErr(err) {
				// Said here, where nothing was sent yet for certain.
				err = fmt.Errorf("%w: %w", errGateDown, err)
			}
			return conn, err
		},
		// Workloads are few per worker and a router talks to many workers:
		// keep a generous idle pool so steady traffic never re-dials.
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Workloads speak cleartext HTTP/1.1 (upgrades need it).
		ForceAttemptHTTP2: false,
	}
	p := &proxy{}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			a := pr.Out.Context().Value(attemptKey{}).(*attempt)
			pr.SetURL(&url.URL{Scheme: "http", Host: a.target.at.poolKey()})
			// The workload sees the name it was addressed by, as behind
			// any ingress, and who asked.
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport: transport,
		// Stream: every write of the workload reaches the client at once.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			a := resp.Request.Context().Value(attemptKey{}).(*attempt)
			if t := a.target.activationStart; !t.IsZero() {
				now := time.Now()
				a.target.activation.Observe(now.Sub(t).Seconds())
				tracing.Phase(resp.Request.Context(), "router.activation", t, now)
			}
			return nil
		},
		ErrorHandler: p.fail,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		// Without a pool the proxy allocates a 32 KiB buffer for every
		// response it copies: most of the router's garbage, and the GC
		// time that came with it (BenchmarkProxy).
		BufferPool: &copyBuffers{},
	}
	return p
}

// copyBuffers lends the proxy its response copy buffers.
type copyBuffers struct{ pool sync.Pool }

const copyBufferSize = 32 << 10

func (c *copyBuffers) Get() []byte {
	if b, ok := c.pool.Get().(*[]byte); ok {
		return *b
	}
	return make([]byte, copyBufferSize)
}

func (c *copyBuffers) Put(b []byte) {
	if cap(b) == copyBufferSize {
		b = b[:copyBufferSize]
		c.pool.Put(&b)
	}
}

// serve proxies req, with body (nil: none), to t; when the workload did
// not answer, it returns why and leaves the answer to the caller. body is
// released when serve returns.
func (p *proxy) serve(w http.ResponseWriter, req *http.Request, t proxyTarget, body *heldBody) (proxyOutcome, error) {
	a := &attempt{target: t, outcome: proxied}
	out := req.WithContext(context.WithValue(req.Context(), attemptKey{}, a))
	if body != nil {
		out.Body = body
		defer body.release(w)
	}
	p.rp.ServeHTTP(w, out)
	return a.outcome, a.err
}

// fail notes why the workload did not answer; the ReverseProxy calls it
// before writing anything.
func (p *proxy) fail(_ http.ResponseWriter, req *http.Request, err error) {
	a := req.Context().Value(attemptKey{}).(*attempt)
	// A failed dial or a refusal sent nothing (not even the body), so
	// the request can safely go elsewhere; anything else failed once the
	// gate had admitted the connection, after which the request may have
	// reached the workload.
	a.err = err
	switch {
	case errors.Is(err, slotgate.ErrStale):
		a.outcome = refused
	case errors.Is(err, errGateDown):
		a.outcome = gateDown
	case errors.Is(err, slotgate.ErrUnreachable):
		a.outcome = unreachable
	case req.Context().Err() != nil:
		a.outcome = unanswered
	default:
		a.outcome = cut
	}
}

// recorder notes the status and size of a response for the access log. It
// passes flushes and hijacks through (streams and upgrades).
type recorder struct {
	http.ResponseWriter
	status int
	bytes  atomic.Int64
	// id is the request's id, err what went wrong when the router answered
	// itself: both for the request's log line.
	id  string
	err error
	// expected: the answer is the normal one for the request (a paused
	// or killed sandbox's 502), not a failure worth a warning.
	expected bool
	// interim: an interim (1xx) answer was passed on, after which the
	// request is not sent again.
	interim bool
	// hijacked keeps the connection Hijack hands over, for a drain.
	hijacked *hijackedConns
}

// answer writes the router's own answer: msg and the request id for the
// client, err (the whole story) for the log line.
func (r *recorder) answer(status int, msg string, err error) {
	r.err = err
	if r.status != 0 {
		return // something was sent already (an upgrade failing half way)
	}
	http.Error(r, fmt.Sprintf("torpor router: %s (request id %s)", msg, r.id), status)
}

// answerJSON is answer for the clients of sandboxes, in the shape E2B's
// edge answers with and the SDK reads the message of:
// {"code": <status>, "message": "..."}, the message naming the sandbox.
func (r *recorder) answerJSON(status int, msg string, err error) {
	r.err = err
	if r.status != 0 {
		return
	}
	body, _ := json.Marshal(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, fmt.Sprintf("torpor router: %s (request id %s)", msg, r.id)})
	h := r.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	r.WriteHeader(status)
	_, _ = r.Write(append(body, '\n'))
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 && code >= 200 { // 1xx are interim
		r.status = code
	}
	r.interim = r.interim || code < 200
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes.Add(int64(n))
	return n, err
}

// written reports whether anything of an answer went to the client.
func (r *recorder) written() bool { return r.status != 0 || r.interim }

// Unwrap lets http.ResponseController reach Flush and deadlines.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Hijack hands the connection to an upgraded protocol, counting what is
// sent to the client over it.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(r.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	r.status = http.StatusSwitchingProtocols
	return r.hijacked.keep(&countingConn{Conn: conn, written: &r.bytes}), rw, nil
}

type countingConn struct {
	net.Conn
	written *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

package router

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"testing"

	"connectrpc.com/connect"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// BenchmarkProxy measures the latency the router adds for a running actor:
// the same small request straight to the workload ("direct"), through a
// bare httputil.ReverseProxy ("bare-proxy": the cost of any extra hop), and
// through the router ("router": an API client with a certificate, as
// torpor router is), sequentially over keep-alive connections. router
// minus direct is the router's cost per request; router minus bare-proxy
// is what its own work (addressing, cache, tracking, metrics, log) adds to
// the hop. "router-admin-token" calls the API with the admin token instead,
// which the server checks without a store read: the difference is the cost
// of reading the client's record on every call.
func BenchmarkProxy(b *testing.B) {
	e := newEnv(b, 1, helloWorkload)
	key := e.createActor("app", nil)
	tr := e.newRouter(Config{})
	if status, body := tr.get(b, key, "/"); status != http.StatusOK {
		b.Fatalf("resume through the router: %d %q", status, body)
	}
	a, err := e.actors.GetActor(context.Background(), connect.NewRequest(&torporv1.GetRequest{Space: key.Space, Name: key.Name}))
	if err != nil {
		b.Fatal(err)
	}
	direct, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s:%d/", a.Msg.GetStatus().GetWorker().GetIp(), e.port), nil)
	if err != nil {
		b.Fatal(err)
	}
	routed := tr.request(b, http.MethodGet, key, "/", nil)
	withToken := e.newRouter(Config{HTTPClient: e.apiClient}).request(b, http.MethodGet, key, "/", nil)
	bare := httptest.NewServer(httputil.NewSingleHostReverseProxy(direct.URL))
	defer bare.Close()
	viaBare, err := http.NewRequest(http.MethodGet, bare.URL+"/", nil)
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, bc := range []struct {
		name string
		req  *http.Request
	}{{"direct", direct}, {"bare-proxy", viaBare}, {"router", routed}, {"router-admin-token", withToken}} {
		b.Run(bc.name, func(b *testing.B) {
			// B/op counts the whole process's: the client's, the
			// proxy's, the gate's and the workload's.
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Do(bc.req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}

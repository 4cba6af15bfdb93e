package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/store/storetest"
)

// The dashboard's files come from the binary without a credential (they
// hold no data), only its own files may run in the page, and the data
// calls it makes need the token like any API call.
func TestDashboardServed(t *testing.T) {
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	anonymous := testClient(t, r.roots, nil, "")
	for path, want := range map[string]string{
		"/dashboard/":              `<script src="dashboard.js" defer></script>`,
		"/dashboard/dashboard.js":  `fetch(`,
		"/dashboard/dashboard.css": `#chart svg`,
	} {
		resp, err := anonymous.Get(r.url + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %s, want 200 with %q", path, resp.Status, want)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q, want only the page's own files", path, csp)
		}
	}
	resp, err := anonymous.Post(r.url+"/torpor.v1.ActorService/ListActors", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("ListActors without a token: %s, want 401", resp.Status)
	}
}

package server

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/store/storetest"
	"github.com/torpor-dev/torpor/internal/version"
)

// An operator joins any server metric with the build that produced it.
func TestMetricsExportBuildInfo(t *testing.T) {
	r := startReplica(t, storetest.URL(t, "sqlite"), io.Discard)
	resp, err := r.admin(t).Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %s", resp.Status)
	}
	i := version.Get()
	want := `torpor_build_info{goversion="` + i.GoVersion + `",revision="` + i.Revision + `",version="` + i.Version + `"} 1`
	if !strings.Contains(string(page), want) {
		t.Errorf("metrics lack %s", want)
	}
}

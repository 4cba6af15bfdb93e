package version

import (
	"maps"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestGetWithoutStampedVersionIsDevel(t *testing.T) {
	i := Get()
	if i.Version != "devel" {
		t.Errorf("Version = %q, want devel for an unstamped build", i.Version)
	}
	if i.GoVersion != runtime.Version() {
		t.Errorf("GoVersion = %q, want %q", i.GoVersion, runtime.Version())
	}
	if s := i.String(); !strings.HasPrefix(s, "torpor devel (") || !strings.Contains(s, runtime.Version()) {
		t.Errorf("String() = %q", s)
	}
}

func TestCollectorExportsBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetName() != "torpor_build_info" || len(families[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one torpor_build_info sample", families)
	}
	m := families[0].GetMetric()[0]
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("value = %v, want 1", v)
	}
	i := Get()
	want := map[string]string{"version": "devel", "revision": i.Revision, "goversion": i.GoVersion}
	got := map[string]string{}
	for _, l := range m.GetLabel() {
		got[l.GetName()] = l.GetValue()
	}
	if !maps.Equal(got, want) {
		t.Errorf("labels = %v, want %v", got, want)
	}
}

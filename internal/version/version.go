// Package version says which build of Torpor is running: the release
// version the Makefile stamps, and the commit and toolchain `go build`
// records in the binary.
package version

import (
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// version is set by the Makefile's build target (-ldflags -X) from
// `git describe --tags --always --dirty`; a plain `go build` or `go test`
// leaves it empty.
var version string

// Info describes the running binary.
type Info struct {
	// Version is the release version, or "devel" for a build without one.
	Version string
	// Revision is the commit the binary was built from, with "-dirty" when
	// the work tree had changes; empty outside a git checkout.
	Revision string
	// Time is the commit time of Revision (RFC 3339), empty without it.
	Time      string
	GoVersion string
}

// Get reads the build information recorded in the binary.
func Get() Info {
	info := Info{Version: version}
	if info.Version == "" {
		info.Version = "devel"
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.GoVersion = bi.GoVersion
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified && info.Revision != "" {
		info.Revision += "-dirty"
	}
	return info
}

// String is the one-line form `torpor --version` prints.
func (i Info) String() string {
	return fmt.Sprintf("torpor %s (commit %s of %s, %s)",
		i.Version, orUnknown(i.Revision), orUnknown(i.Time), i.GoVersion)
}

// Long is what `torpor version` prints: one field a line.
func (i Info) Long() string {
	return fmt.Sprintf("version:      %s\ncommit:       %s\ncommit time:  %s\ngo:           %s\n",
		i.Version, orUnknown(i.Revision), orUnknown(i.Time), i.GoVersion)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// NewRegistry is a registry with what every process serves: the Go
// runtime's and the process's metrics and torpor_build_info. A process
// that runs several roles (torpor up) gives them one, so that each is
// there once.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), Collector())
	return reg
}

// Collector is the torpor_build_info gauge: always 1, its labels carry the
// build, so dashboards can join any metric with the version that produced
// it.
func Collector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "torpor_build_info",
		Help:        "Build of the running binary (always 1): version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	return g
}

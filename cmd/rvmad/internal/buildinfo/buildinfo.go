// Package buildinfo says which rvmad is running: the version stamped at
// link time, the VCS revision Go recorded, and the Go version.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is set at link time: -ldflags "-X github.com/rdmaplus/rdmaplus/cmd/rvmad/internal/buildinfo.Version=v1.2.3".
var Version = "dev"

// Revision returns the VCS revision recorded in the binary ("unknown" when
// built with -buildvcs=false or outside a repository), with "+dirty" when
// the tree had changes.
func Revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "unknown", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}

// String is "rvmad <version> (revision <rev>, <go version>)".
func String() string {
	return "rvmad " + Version + " (revision " + Revision() + ", " + runtime.Version() + ")"
}

// Collector returns the rvmad_build_info gauge (always 1, labels version,
// revision and goversion).
func Collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "rvmad", Name: "build_info",
		Help:        "A metric with a constant 1 labelled with the version, revision and Go version rvmad was built from.",
		ConstLabels: prometheus.Labels{"version": Version, "revision": Revision(), "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}

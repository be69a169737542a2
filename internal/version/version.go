// Package version reports the build's version, set by the Makefile's ldflags.
package version

import (
	"fmt"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// Version is overwritten at link time with `git describe`.
var Version = "dev"

// String is the one-line version report of `clustermap version`.
func String() string {
	return fmt.Sprintf("clustermap %s (%s, %s/%s)", Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// BuildInfo is a gauge that is 1 while a component (controller, dns) of
// this build runs: the alert on an absent controller looks for it, so it
// is there whatever the modes.
func BuildInfo(component string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "clustermap_build_info",
		Help:        "1 while a clustermap component runs, by component (controller, dns) and version.",
		ConstLabels: prometheus.Labels{"component": component, "version": Version},
	})
	g.Set(1)
	return g
}

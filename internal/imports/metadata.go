package imports

import (
	"strings"
)

// deniedDomains are label and annotation prefixes other controllers, or
// clustermap itself, act on: an exported ServiceExport's labels and
// annotations carrying them are not copied onto imports, so that another
// cluster (or account) cannot make an import look owned by Helm, Argo CD
// or Flux, nor steer clustermap's own adoption and clean-up. Each domain
// covers its subdomains; docs/mcs.md lists them.
var deniedDomains = []string{
	"clustermap.io",
	"multicluster.k8s.aws",
	"multicluster.kubernetes.io",
	"multicluster.x-k8s.io",
	"kubernetes.io", // app.kubernetes.io apart: see deniedKeys
	"k8s.io",
	"helm.sh",
	"argoproj.io",
	"fluxcd.io",
}

// deniedKeys are single keys of otherwise exportable domains: clustermap's
// own ownership label, and Argo CD's default tracking label.
var deniedKeys = map[string]bool{
	LabelManagedBy:               true,
	"app.kubernetes.io/instance": true,
}

// Exportable says whether an exported label or annotation key may be
// copied onto an import.
func Exportable(key string) bool {
	if deniedKeys[key] {
		return false
	}
	prefix, _, found := strings.Cut(key, "/")
	if !found {
		return true
	}
	if prefix == "app.kubernetes.io" {
		return true
	}
	for _, d := range deniedDomains {
		if prefix == d || strings.HasSuffix(prefix, "."+d) {
			return false
		}
	}
	return true
}

// exportable keeps the entries of m whose keys are Exportable (nil when
// none is left).
func exportable(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		if !Exportable(k) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// Package kube is what every mode and command shares to reach a cluster:
// the Scheme, client configuration, the namespace filter, explicit metric
// registration, and the event mappers reconcilers share.
package kube

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
)

// Scheme knows every type clustermap reads or writes.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(mcsv1beta1.Install(s))
	utilruntime.Must(aboutv1alpha1.AddToScheme(s))
	return s
}

// RESTConfig reaches a cluster through a kubeconfig file and context, or
// in-cluster (or $KUBECONFIG) when both are empty.
func RESTConfig(kubeconfig, context string) (*rest.Config, error) {
	if kubeconfig == "" && context == "" {
		return ctrl.GetConfig()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, err
	}
	// As ctrl.GetConfig does in a cluster: no client-side limit, the
	// apiserver's priority and fairness instead. client-go's default (5
	// requests/s, bursts of 10) made a controller that comes back to a
	// backlog write its imports, replicas and finalizers 5 a second.
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

// DefaultStatusNamespace is where clustermap runs unless told: its status
// Lease and leader Lease go there.
const DefaultStatusNamespace = "clustermap-system"

// DefaultExcludeNamespaces are the system namespaces left alone by default.
var DefaultExcludeNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// NamespaceFilter says whether clustermap works in a namespace: one of
// include (all when empty), none of exclude. "" (cluster-scoped) is in.
func NamespaceFilter(include, exclude []string) func(string) bool {
	inc, exc := map[string]bool{}, map[string]bool{}
	for _, n := range include {
		inc[n] = true
	}
	for _, n := range exclude {
		exc[n] = true
	}
	return func(ns string) bool {
		if exc[ns] {
			return false
		}
		return len(inc) == 0 || inc[ns] || ns == ""
	}
}

// Register registers collectors; one registered before (a second
// controller in the same process, as tests and the demo run) is kept.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) {
	for _, c := range cs {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			panic(err)
		}
	}
}

// MetricsServing is how /metrics is served: plain HTTP, or with secure
// HTTPS (a self-signed certificate) to callers the API server authenticates
// (TokenReview) and authorizes (SubjectAccessReview), as kube-state-metrics
// and the kubelet do.
func MetricsServing(addr string, secure bool) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr, SecureServing: secure}
	if secure {
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return o
}

// EndpointReady says whether an EndpointSlice endpoint is ready: unless it
// says it is not, as the EndpointSlice API reads a missing condition.
func EndpointReady(c discoveryv1.EndpointConditions) bool {
	return c.Ready == nil || *c.Ready
}

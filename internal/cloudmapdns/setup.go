package cloudmapdns

import (
	"context"
	"time"

	servicediscovery "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/withdraw"
)

// Options of the --cloudmap-dns mode.
type Options struct {
	CloudMap *servicediscovery.Client
	// ClusterName names this cluster on instances (clusterid.Name when
	// empty).
	ClusterName string
	TTL         int64
	DriftPeriod time.Duration
	Namespaces  func(string) bool
	// Withdrawal, when requested, deregisters every Service (clustermap
	// uninstall); the Services keep their annotations.
	Withdrawal *withdraw.Signal
	// CloudMapNamespaces, when set, are the only Cloud Map namespaces
	// Services may be registered in.
	CloudMapNamespaces []string
	Recorder           record.EventRecorder
	Metrics            prometheus.Registerer
	// OnRead, when set, hears how each read of a registered service's
	// instances went.
	OnRead func(error)
	Log    logr.Logger
}

// Setup adds the mode to mgr and returns the name it registers this
// cluster under.
func Setup(ctx context.Context, mgr manager.Manager, o Options) (string, error) {
	cluster, err := clusterid.Name(ctx, mgr.GetAPIReader(), o.ClusterName)
	if err != nil {
		return "", err
	}
	kube.Register(o.Metrics, Metrics()...)
	o.Log.Info("registering annotated Services in Cloud Map", "cluster", cluster)
	return cluster, (&Reconciler{Client: mgr.GetClient(), CloudMap: o.CloudMap, Cluster: cluster, TTL: o.TTL, DriftPeriod: o.DriftPeriod,
		Recorder: o.Recorder, Namespaces: o.Namespaces, Withdrawal: o.Withdrawal, CloudMapNamespaces: o.CloudMapNamespaces, OnRead: o.OnRead}).SetupWithManager(mgr)
}

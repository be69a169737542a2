package replication

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/kube"
)

// Events about peer kubeconfig files.
const (
	ReasonPeerKubeconfigRefused = "PeerKubeconfigRefused"
	ReasonPeerKubeconfigInvalid = "PeerKubeconfigInvalid"
)

// Options of the --syndicate mode.
type Options struct {
	// ClusterName is this cluster's name, as peers' files name it (the
	// cluster.clusterset.k8s.io ClusterProperty when empty).
	ClusterName string
	PeersDir    string
	// Namespaces and ExcludeNamespaces as the flags say; InScope decides.
	Namespaces, ExcludeNamespaces []string
	InScope                       func(string) bool
	CreateNamespaces              bool
	Grace                         time.Duration
	AllowExecPlugins              bool
	AllowInsecurePeers            bool
	Recorder                      record.EventRecorder
	// EventsOn receives the Events about peer kubeconfig files, which have
	// no Kubernetes object of their own (the status Lease).
	EventsOn client.Object
	Metrics  prometheus.Registerer
	Log      logr.Logger
}

// Setup adds the mode to mgr and returns this cluster's name and its
// peers.
func Setup(ctx context.Context, mgr manager.Manager, o Options) (string, *Peers, error) {
	cluster := o.ClusterName
	if cluster == "" {
		cp := &aboutv1alpha1.ClusterProperty{}
		if err := mgr.GetAPIReader().Get(ctx, client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, cp); err != nil || cp.Spec.Value == "" {
			return "", nil, errors.New("--syndicate needs this cluster's name: pass --cluster-name, the name peers' kubeconfig files use for it")
		}
		cluster = cp.Spec.Value
	}
	kube.Register(o.Metrics, Metrics()...)
	o.Log.Info("replicating Services to peers", "cluster", cluster, "peers", o.PeersDir)
	peers := &Peers{Dir: o.PeersDir, Scheme: mgr.GetScheme(), Log: o.Log.WithName("peers"),
		Namespaces: o.Namespaces, ExcludeNamespaces: o.ExcludeNamespaces, AllowExecPlugins: o.AllowExecPlugins, AllowInsecurePeers: o.AllowInsecurePeers}
	peers.OnBroken = func(peer, file string, err error) {
		reason := ReasonPeerKubeconfigInvalid
		if errors.Is(err, ErrExecPlugin) || errors.Is(err, ErrInsecurePeer) {
			reason = ReasonPeerKubeconfigRefused
		}
		o.Recorder.Eventf(o.EventsOn, corev1.EventTypeWarning, reason, "peer %s (%s): %v; the peer counts as down and its replicas here are kept until the file is fixed", peer, file, err)
	}
	return cluster, peers, (&Reconciler{Client: mgr.GetClient(), Cluster: cluster, Peers: peers, Recorder: o.Recorder, Namespaces: o.InScope,
		CreateNamespaces: o.CreateNamespaces, Grace: o.Grace}).SetupWithManager(mgr)
}

// Package controller wires `clustermap controller`: a controller-runtime
// manager running the reconcilers its flags choose.
package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	servicediscovery "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/mcs"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/migrate"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/internal/telemetry"
	"github.com/clustermap/clustermap/internal/version"
	"github.com/clustermap/clustermap/internal/withdraw"
)

// Options of `clustermap controller`.
type Options struct {
	// Config, when set, is used instead of Kubeconfig and Context.
	Config              *rest.Config
	Kubeconfig, Context string

	CloudMapEndpoint, Region string
	// OwnerAccount, when set, is the AWS account that owns the
	// clusterset's Cloud Map namespaces and shares them, through AWS RAM,
	// with the accounts of the other clusters.
	OwnerAccount string
	// Regions are every Region the clusterset's clusters export to: this
	// cluster exports to its own (Region) and imports from all of them.
	Regions []string
	// CloudMapCredentials, when set, replace the default credential chain
	// (the local emulator's).
	CloudMapCredentials aws.CredentialsProvider
	CloudMapQPS         float64
	CloudMapBurst       int
	CloudMapDataQPS     float64
	CloudMapDataBurst   int
	Watch               cloudmap.WatchOptions
	// OnCloudMapCall, when set, hears of every Cloud Map call (HTTP
	// attempt) besides the metric: benchmarks count calls per cluster.
	OnCloudMapCall func(operation string, err error)

	MetricsAddr, ProbeAddr string
	// MetricsSecure serves /metrics over HTTPS to clients the API server
	// authenticates and authorizes (get on the non-resource URL /metrics).
	MetricsSecure           bool
	LeaderElect             bool
	LeaderElectionNamespace string
	// Lease timing; zero means the Default* values.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// LeaderElectionIdentity names this replica in the lease (the chart
	// passes the pod's name). A replica restarted in place (kill -9, OOM,
	// a crash) then finds its own name there and renews at once, where a
	// fresh random name waits the lease out. Replicas running at the same
	// time must have different ones; empty means a random one.
	LeaderElectionIdentity string
	// StatusNamespace holds the status Lease clustermap status reads.
	StatusNamespace string
	// RecordVersion, when set, is the Cloud Map record format to write
	// instead of this release's: version-skew tests run a cluster as an
	// older (or newer) release would.
	RecordVersion int
	// PerEndpointRecords keeps Cloud Map's per-endpoint records for callers
	// that read them directly (--cloudmap-endpoint-records).
	PerEndpointRecords bool
	// NamespaceInstanceQuota is the account's Cloud Map quota of
	// instances per namespace (0: the default 2,000).
	NamespaceInstanceQuota int
	// MaxImportEndpoints caps the endpoint records imported of each
	// cluster's export of a Service (--max-import-endpoints).
	MaxImportEndpoints int

	// Namespaces, when set, are the only ones clustermap works in;
	// ExcludeNamespaces are never worked in.
	Namespaces, ExcludeNamespaces []string

	MCS bool
	// HubKubeconfig, when set, makes the MCS mode's registry the hub
	// cluster it reaches (clustermap hub join wrote it) instead of Cloud
	// Map (--registry=hub).
	HubKubeconfig string
	// MigratingFrom, when set, is the registry the clusterset moves from
	// (registry.CloudMap, to the hub; registry.Hub, to Cloud Map, which
	// HubKubeconfig then no longer makes the registry), in MigrationPhase
	// (--registry-migrating-from, --registry-migration-phase).
	MigratingFrom  string
	MigrationPhase migrate.Phase

	// CloudMapDNS registers annotated Services in Cloud Map DNS namespaces.
	CloudMapDNS bool
	// ClusterName names this cluster on Cloud Map instances (default: the
	// cluster.clusterset.k8s.io ClusterProperty, else kube-system's UID).
	ClusterName string
	DNSTTL      int64
	DriftPeriod time.Duration
	// CloudMapDNSNamespaces, when set, are the only Cloud Map namespaces
	// the Cloud Map DNS mode registers in.
	CloudMapDNSNamespaces []string

	// Syndicate replicates Services straight to the peers whose kubeconfigs
	// are in PeersDir.
	Syndicate        bool
	PeersDir         string
	CreateNamespaces bool
	PeerGrace        time.Duration
	// AllowExecPlugins lets peer kubeconfigs run commands for credentials.
	AllowExecPlugins bool
	// AllowInsecurePeers lets peer kubeconfigs read local files, skip TLS
	// verification, use plain HTTP or a proxy.
	AllowInsecurePeers bool

	Log logr.Logger
}

// Leader election timing. A leader lost without a goodbye (a node gone, or
// kill -9 without an identity) is replaced once its lease runs out: within
// about 12 s with 10 s, where the usual 15 s took 17. The leader renews
// every RetryPeriod either way, so the apiserver sees no more writes; the
// cost is a leader stepping down (and restarting) when it cannot renew for
// RenewDeadline, still longer than an apiserver restart takes (4 s here).
const (
	DefaultLeaseDuration = 10 * time.Second
	DefaultRenewDeadline = 8 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// leaseLock is the leader lease under this replica's identity, built as
// controller-runtime builds its own (which always adds a random suffix);
// nil without an identity.
func leaseLock(cfg *rest.Config, o Options) (resourcelock.Interface, error) {
	if !o.LeaderElect || o.LeaderElectionIdentity == "" {
		return nil, nil
	}
	ns := o.LeaderElectionNamespace
	if ns == "" {
		data, err := os.ReadFile(inClusterNamespaceFile)
		if err != nil {
			return nil, fmt.Errorf("leader election outside a cluster needs --leader-election-namespace: %w", err)
		}
		ns = strings.TrimSpace(string(data))
	}
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	// One hung request must not outlast the renew deadline.
	cfg.Timeout = max(time.Second, orDefault(o.RenewDeadline, DefaultRenewDeadline)/2)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return resourcelock.New(resourcelock.LeasesResourceLock, ns, LeaderElectionID, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: o.LeaderElectionIdentity})
}

// LeaderElectionID names the leader Lease.
const LeaderElectionID = "clustermap-controller"

const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// outsideCluster says the controller runs as a process, not in a pod: no
// install made its namespace.
func outsideCluster() bool {
	_, err := os.Stat(inClusterNamespaceFile)
	return err != nil
}

var setRootLogger sync.Once

// Shipped Cloud Map call budgets, per controller (cloudmapclient says why).
const (
	DefaultCloudMapQPS       = cloudmapclient.DefaultQPS
	DefaultCloudMapBurst     = cloudmapclient.DefaultBurst
	DefaultCloudMapDataQPS   = cloudmapclient.DefaultDataQPS
	DefaultCloudMapDataBurst = cloudmapclient.DefaultDataBurst
)

func restConfig(o Options) (*rest.Config, error) {
	if o.Config != nil {
		return o.Config, nil
	}
	return kube.RESTConfig(o.Kubeconfig, o.Context)
}

// Run runs the controller until ctx ends.
func Run(ctx context.Context, o Options) error {
	if !o.MCS && !o.CloudMapDNS && !o.Syndicate {
		return errors.New("no reconciler selected: enable --mcs, --cloudmap-dns or --syndicate")
	}
	if err := o.Watch.Validate(); err != nil {
		return fmt.Errorf("--silent-cluster-ttl: %w", err)
	}
	if o.MaxImportEndpoints < 0 {
		return fmt.Errorf("--max-import-endpoints %d: want a number of endpoint records (0: the default, %d)", o.MaxImportEndpoints, registry.DefaultMaxImportEndpoints)
	}
	cfg, err := restConfig(o)
	if err != nil {
		return fmt.Errorf("reaching the cluster: %w (pass --kubeconfig and --context, or run in a cluster)", err)
	}
	log := o.Log
	// Libraries below controller-runtime log through its root logger.
	setRootLogger.Do(func() { ctrl.SetLogger(log) })
	lock, err := leaseLock(cfg, o)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  kube.Scheme(),
		Logger:                  log,
		Metrics:                 kube.MetricsServing(o.MetricsAddr, o.MetricsSecure),
		HealthProbeBindAddress:  o.ProbeAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        LeaderElectionID,
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		// Set only with an identity; otherwise controller-runtime's own.
		LeaderElectionResourceLockInterface: lock,
		// A leader that stops (SIGTERM: a rollout, a drain) hands the lease
		// over at once rather than making its successor wait the lease out.
		// Safe: the process exits as soon as the manager stops.
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr.To(orDefault(o.LeaseDuration, DefaultLeaseDuration)),
		RenewDeadline:                 ptr.To(orDefault(o.RenewDeadline, DefaultRenewDeadline)),
		RetryPeriod:                   ptr.To(orDefault(o.RetryPeriod, DefaultRetryPeriod)),
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return err
	}
	inScope := kube.NamespaceFilter(o.Namespaces, o.ExcludeNamespaces)
	recorder := mgr.GetEventRecorderFor("clustermap")
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	reporter := &statuslease.Reporter{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: o.StatusNamespace,
		Holder: holderName(), Version: version.Version, Modes: modes(o), Log: log.WithName("status"), CreateNamespace: outsideCluster()}
	if reporter.Namespace == "" {
		reporter.Namespace = kube.DefaultStatusNamespace
	}
	if err := mgr.Add(reporter); err != nil {
		return err
	}
	// clustermap uninstall's request to withdraw (the leader reads it).
	withdrawal := &withdraw.Signal{}
	var sd *servicediscovery.Client
	var regions []mcs.Region
	var account string
	kube.Register(metrics.Registry, version.BuildInfo("controller"))
	var hubCfg *rest.Config
	if o.HubKubeconfig != "" {
		if hubCfg, err = hubConfig(o.HubKubeconfig); err != nil {
			return err
		}
		log.Info("using a hub cluster", "hub", hubCfg.Host, "migratingFrom", o.MigratingFrom)
	}
	target := registry.CloudMap
	if hubCfg != nil && o.MigratingFrom != registry.Hub {
		target = registry.Hub
	}
	if o.MCS && (target == registry.CloudMap || o.MigratingFrom == registry.CloudMap) || o.CloudMapDNS {
		kube.Register(metrics.Registry, telemetry.Collectors()...)
		co := cloudmapclient.Options{Endpoint: o.CloudMapEndpoint, Region: o.Region, Credentials: o.CloudMapCredentials, QPS: o.CloudMapQPS, Burst: o.CloudMapBurst,
			DataQPS: o.CloudMapDataQPS, DataBurst: o.CloudMapDataBurst}
		if sd, regions, err = cloudMapClients(ctx, co, o); err != nil {
			return err
		}
		if account, err = callerAccount(ctx, co); err != nil {
			if o.OwnerAccount != "" {
				return fmt.Errorf("%w: a clusterset across accounts (--cloudmap-owner-account) needs this account's id; allow sts:GetCallerIdentity through an STS endpoint (AWS_ENDPOINT_URL_STS for a VPC endpoint)", err)
			}
			log.Info("cannot tell which AWS account this is (only logs and clustermap status miss it)", "error", err.Error())
			account = "unknown"
		}
		names := make([]string, len(regions))
		for i, r := range regions {
			names[i] = r.Name
		}
		log.Info("using Cloud Map", "region", sd.Options().Region, "account", account, "namespaceOwner", o.OwnerAccount, "importRegions", names)
	}
	if o.MCS {
		usage := cloudmap.NewUsage(o.NamespaceInstanceQuota)
		kube.Register(metrics.Registry, usage)
		reporter.Quota = usage.Summary
		if err := mcs.Setup(mgr, mcs.Options{Hub: hubCfg, To: target, MigratingFrom: o.MigratingFrom, MigrationPhase: o.MigrationPhase, CloudMap: sd, Regions: regions, Owner: o.OwnerAccount, Account: account, Watch: o.Watch, Controller: "clustermap " + version.Version, RecordVersion: o.RecordVersion,
			PerEndpointRecords: o.PerEndpointRecords, Usage: usage, MaxImportEndpoints: o.MaxImportEndpoints,
			Namespaces: inScope, Withdrawal: withdrawal, Recorder: recorder, Log: log, Metrics: metrics.Registry, Status: reporter}); err != nil {
			return err
		}
	}
	if o.CloudMapDNS {
		cluster, err := cloudmapdns.Setup(ctx, mgr, cloudmapdns.Options{CloudMap: sd, ClusterName: o.ClusterName, TTL: o.DNSTTL, DriftPeriod: o.DriftPeriod,
			Namespaces: inScope, Withdrawal: withdrawal, CloudMapNamespaces: o.CloudMapDNSNamespaces, Recorder: recorder, Metrics: metrics.Registry, Log: log,
			OnRead: func(err error) {
				if err == nil {
					telemetry.Synced(telemetry.ModeCloudMapDNS, sd.Options().Region, time.Now())
				}
			}})
		if err != nil {
			return err
		}
		reporter.SetCluster(cluster)
	}
	if o.Syndicate {
		cluster, peers, err := replication.Setup(ctx, mgr, replication.Options{ClusterName: o.ClusterName, PeersDir: o.PeersDir,
			Namespaces: o.Namespaces, ExcludeNamespaces: o.ExcludeNamespaces, InScope: inScope, CreateNamespaces: o.CreateNamespaces,
			Grace: o.PeerGrace, AllowExecPlugins: o.AllowExecPlugins, AllowInsecurePeers: o.AllowInsecurePeers, Recorder: recorder,
			EventsOn: &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: reporter.Namespace, Name: statuslease.LeaseName}},
			Metrics:  metrics.Registry, Log: log})
		if err != nil {
			return err
		}
		reporter.SetCluster(cluster)
		reporter.PeersDown = peers.Down
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return withdrawal.Watch(ctx, mgr.GetAPIReader(), reporter.Namespace, log.WithName("withdraw"))
	})); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// cloudMapClients makes the home Region's client and, for --regions, one
// per Region (the home one among them), each with its own call budgets:
// AWS applies its quotas per account and Region.
func cloudMapClients(ctx context.Context, co cloudmapclient.Options, o Options) (*servicediscovery.Client, []mcs.Region, error) {
	client := func(region string) (*servicediscovery.Client, error) {
		co := co
		if region != "" {
			co.Region = region
		}
		var name string
		co.OnLimitWait = func(plane string, waited time.Duration) { telemetry.LimitWait(name, plane, waited) }
		co.OnCall = func(op string, err error) {
			telemetry.Call(name, op, err)
			if o.OnCloudMapCall != nil {
				o.OnCloudMapCall(op, err)
			}
		}
		c, err := cloudmapclient.New(ctx, co)
		if err == nil {
			name = c.Options().Region
		}
		return c, err
	}
	home, err := client("")
	if err != nil {
		return nil, nil, err
	}
	regions := []mcs.Region{{Name: home.Options().Region, Client: home}}
	for _, r := range o.Regions {
		if slices.ContainsFunc(regions, func(have mcs.Region) bool { return have.Name == r }) {
			continue
		}
		c, err := client(r)
		if err != nil {
			return nil, nil, fmt.Errorf("--regions %s: %w", r, err)
		}
		regions = append(regions, mcs.Region{Name: r, Client: c})
	}
	return home, regions, nil
}

// callerAccount asks which account the controller runs as: to log, and
// for a clusterset across accounts, to tell its own records from others'.
// STS is not Cloud Map: a private cluster may lack its endpoint, so the
// lookup is bounded.
func callerAccount(ctx context.Context, co cloudmapclient.Options) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cloudmapclient.CallerAccount(ctx, co)
}

func modes(o Options) []string {
	var m []string
	for name, on := range map[string]bool{"mcs": o.MCS, "cloudmap-dns": o.CloudMapDNS, "syndicate": o.Syndicate} {
		if on {
			m = append(m, name)
		}
	}
	sort.Strings(m)
	return m
}

// holderName names this replica: the pod (its hostname) in a cluster.
func holderName() string {
	h, _ := os.Hostname()
	return h
}

// What every mode needs (each mode's role adds its own, make generate):
// Events, this cluster's name from its ClusterProperty, and the reviews
// that guard /metrics (--metrics-secure).
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=about.k8s.io,resources=clusterproperties,verbs=get
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// hubConfig reads the member kubeconfig of a hub registry, refusing one
// that does not stand on its own (what a peer kubeconfig may not do).
func hubConfig(path string) (*rest.Config, error) {
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("--hub-kubeconfig: %w (clustermap hub join writes it)", err)
	}
	if problems := kube.KubeconfigProblems(raw); len(problems) > 0 {
		return nil, fmt.Errorf("--hub-kubeconfig %s: %s: refused; write it with clustermap hub join (inline CA and token, an https:// server)", path, strings.Join(problems, "; "))
	}
	return clientcmd.NewDefaultClientConfig(*raw, nil).ClientConfig()
}

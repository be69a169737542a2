package main

import (
	goflag "flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/migrate"
	"github.com/clustermap/clustermap/internal/replication"
)

func newController() *cobra.Command {
	o := controller.Options{}
	zapOpts := zap.Options{}
	endpointRecords, registryKind, migrationPhase, migratingFrom := "packed", "cloudmap", string(migrate.Both), ""
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller in a member cluster (Multi-Cluster Services over AWS Cloud Map or a hub cluster)",
		Long: `Exports this cluster's ServiceExports to AWS Cloud Map and imports every
cluster's exports as ServiceImports, derived Services and EndpointSlices
(--mcs, on by default).

With --syndicate, replicates each Service with a selector to the peers whose
kubeconfig files are in --peers-dir, as a selector-less Service with
EndpointSlices of the ready pods here; vmware.com/syndicate-mode (source,
receiver, union, singular) migrates a Service between clusters. NSTOWATCH and
EXCLUDE (comma- or space-separated namespaces) work as in
k8s-endpoints-sync-controller.

With --cloudmap-dns, registers the ready endpoints of Services annotated
cloudmap.controller/namespace and cloudmap.controller/hostname in that Cloud
Map namespace, beside instances others (ECS) register there.

Credentials and region come the standard AWS SDK way (environment, shared
config, IRSA, EKS pod identity, instance roles); a region is required
(--region or AWS_REGION). AWS_ENDPOINT_URL_SERVICEDISCOVERY or
--cloudmap-endpoint point it at another endpoint, such as a VPC endpoint
(same credentials) or cloudmap-local (any AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY). The controller logs the Region and the account
(STS GetCallerIdentity) it runs as.

A clusterset across AWS accounts: one account owns the clusterset's Cloud
Map namespaces and shares them with the others through AWS RAM; every
cluster, the owner's too, names it with --cloudmap-owner-account. A
clusterset across Regions: each cluster exports to its own Region and
imports from every Region --regions lists (see docs/accounts-and-regions.md).

Outside AWS: --registry=hub --hub-kubeconfig FILE makes a Kubernetes hub
cluster the MCS registry in place of Cloud Map (clustermap hub init and hub
join; docs/hub.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Log = zap.New(zap.UseFlagOptions(&zapOpts))
			// The original's environment variables, for --syndicate users.
			if v := os.Getenv("NSTOWATCH"); v != "" && !cmd.Flags().Changed("namespaces") {
				o.Namespaces = envList(v)
			}
			if v := os.Getenv("EXCLUDE"); v != "" {
				o.ExcludeNamespaces = append(o.ExcludeNamespaces, envList(v)...)
			}
			if o.Watch.SilentAfter == 0 {
				o.Watch.SilentAfter = -1 // 0 on the command line: never drain
			}
			switch endpointRecords {
			case "packed":
			case "per-endpoint":
				o.PerEndpointRecords = true
			default:
				return fmt.Errorf("--cloudmap-endpoint-records is %q: packed or per-endpoint", endpointRecords)
			}
			if err := registryFlags(&o, registryKind, migratingFrom, migrationPhase); err != nil {
				return err
			}
			ctrl.SetLogger(o.Log)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return controller.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	f.StringVar(&o.Context, "context", "", "kubeconfig context")
	f.StringVar(&o.CloudMapEndpoint, "cloudmap-endpoint", "", "Cloud Map endpoint URL (default: the AWS endpoint of the region)")
	f.StringVar(&o.OwnerAccount, "cloudmap-owner-account", "", "the AWS account that owns the clusterset's Cloud Map namespaces and shares them with the other accounts through AWS RAM (default: none, every cluster in one account)")
	f.StringSliceVar(&o.Regions, "regions", nil, "every AWS Region the clusterset's clusters export to: this cluster exports to its own (--region) and imports from all of them (default: its own only)")
	f.StringVar(&o.Region, "region", "", "AWS region (default: AWS_REGION, AWS_DEFAULT_REGION, the shared config file, then EC2 instance metadata)")
	f.Float64Var(&o.CloudMapQPS, "cloudmap-qps", controller.DefaultCloudMapQPS, "Cloud Map control-plane calls (all but Discover*) per second, at most")
	f.IntVar(&o.CloudMapBurst, "cloudmap-burst", controller.DefaultCloudMapBurst, "Cloud Map control-plane call burst")
	f.Float64Var(&o.CloudMapDataQPS, "cloudmap-data-qps", controller.DefaultCloudMapDataQPS, "Cloud Map DiscoverInstances and DiscoverInstancesRevision calls per second, at most (AWS allows 1,000 and 3,000 per second per account: the default leaves room for 5 clusters at full speed)")
	f.IntVar(&o.CloudMapDataBurst, "cloudmap-data-burst", controller.DefaultCloudMapDataBurst, "Cloud Map data-plane call burst")
	f.StringVar(&endpointRecords, "cloudmap-endpoint-records", "packed", "packed: a few Cloud Map instances per exported Service and cluster, once every cluster of the clusterset reads them (until then, and with another controller in the clusterset, one per endpoint and port); per-endpoint: always one instance per endpoint and port, for callers that read Cloud Map directly (ECS tasks, Lambda, aws servicediscovery discover-instances)")
	f.IntVar(&o.MaxImportEndpoints, "max-import-endpoints", registry.DefaultMaxImportEndpoints, "endpoint records (an address and a port each) imported of one cluster's export of a Service, at most: past it the import takes that many, says EndpointsCapped, and the rest are left out, so that no member's records can make this cluster hold or write more")
	f.IntVar(&o.NamespaceInstanceQuota, "cloudmap-namespace-instance-quota", cloudmap.DefaultNamespaceQuota, "the AWS account's Cloud Map quota of instances per namespace (AWS raises it on request): an export that would pass it is refused whole, and the headroom is measured against it")
	f.DurationVar(&o.Watch.PollInterval, "sync-period", 0, "how often Cloud Map's change feed (ListOperations, or across accounts the change records) is read (default 1.5s)")
	f.IntVar(&o.Watch.MaxPollPages, "cloudmap-poll-pages", 0, "ListOperations pages one poll of the change feed reads at most (Cloud Map pages through every operation of the account before it filters); past them, every service's revision is compared instead (default 5)")
	f.DurationVar(&o.Watch.ReadLag, "cloudmap-read-lag", 0, "how long after a change Cloud Map's DiscoverInstances may still show a service as it was: a changed service is read until a read shows the change, and once more when this has passed (default 5s)")
	f.DurationVar(&o.Watch.ListInterval, "list-period", 0, "how often namespaces and services are listed (default 5m)")
	f.DurationVar(&o.Watch.SilentAfter, "silent-cluster-ttl", cloudmap.DefaultSilentAfter, "drain (keep imported, stop routing to) the endpoints of a cluster that has not proved alive for this long while others have (it lost access to the registry, its controller is down, or it is gone), or for four of the heartbeats it declares if longer; at least 90s, three heartbeats; 0: never")
	f.DurationVar(&o.Watch.SilentAfter, "stale-cluster-expiry", cloudmap.DefaultSilentAfter, "deprecated: --silent-cluster-ttl")
	_ = f.MarkDeprecated("stale-cluster-expiry", "use --silent-cluster-ttl (it drains, no longer drops)")
	f.DurationVar(&o.Watch.SweepInterval, "sweep-period", 0, "how often every known service's revision is checked, a safety net (default 6h)")
	f.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "metrics address (0 turns it off)")
	f.BoolVar(&o.MetricsSecure, "metrics-secure", false, "serve /metrics over HTTPS, only to callers the API server authenticates and allows get on the non-resource URL /metrics (the chart's metrics-reader ClusterRole)")
	f.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "health probe address (0 turns it off)")
	f.BoolVar(&o.LeaderElect, "leader-elect", false, "elect a leader, for several replicas")
	f.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", controller.DefaultLeaseDuration, "how long standbys wait before replacing a leader that stopped renewing")
	f.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", controller.DefaultRenewDeadline, "how long a leader keeps trying to renew before it steps down (less than the lease duration)")
	f.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", controller.DefaultRetryPeriod, "how often the lease is renewed or tried")
	f.StringVar(&o.LeaderElectionIdentity, "leader-elect-identity", os.Getenv("POD_NAME"), "this replica's name in the leader lease, unique among running replicas and kept across restarts so that a restarted leader takes its lease back at once (default: $POD_NAME, else a random name)")
	f.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
	f.StringVar(&o.StatusNamespace, "status-namespace", kube.DefaultStatusNamespace, "namespace of the status Lease that clustermap status reads (the controller's own)")
	f.StringSliceVar(&o.Namespaces, "namespaces", nil, "only these namespaces (default: all)")
	f.StringSliceVar(&o.ExcludeNamespaces, "exclude-namespaces", kube.DefaultExcludeNamespaces, "never these namespaces")
	f.BoolVar(&o.MCS, "mcs", true, "run the Multi-Cluster Services reconcilers")
	f.StringVar(&registryKind, "registry", "cloudmap", "the MCS mode's registry: cloudmap (AWS Cloud Map), or hub (a Kubernetes hub cluster, --hub-kubeconfig; docs/hub.md)")
	f.StringVar(&o.HubKubeconfig, "hub-kubeconfig", "", "with --registry=hub: the member kubeconfig clustermap hub join wrote")
	f.StringVar(&migratingFrom, "registry-migrating-from", "", "while the clusterset moves from one registry to the other: the one it moves from (cloudmap or hub; the other is --registry); this cluster reads both (docs/hub.md)")
	f.StringVar(&migrationPhase, "registry-migration-phase", string(migrate.Both), "with --registry-migrating-from: both (write to both registries) or leaving (write to --registry only, and withdraw this cluster's exports from the old one; once every cluster writes to both)")
	f.BoolVar(&o.CloudMapDNS, "cloudmap-dns", false, "register Services annotated "+cloudmapdns.AnnotationNamespace+" and "+cloudmapdns.AnnotationHostname+" in Cloud Map (ECS-compatible)")
	f.StringVar(&o.ClusterName, "cluster-name", "", "this cluster's name on Cloud Map instances (default: the cluster.clusterset.k8s.io ClusterProperty, else kube-system's UID)")
	f.Int64Var(&o.DNSTTL, "dns-ttl", 10, "TTL in seconds of the DNS records of Cloud Map services clustermap creates")
	f.DurationVar(&o.DriftPeriod, "drift-period", time.Minute, "how often registered instances are re-read from Cloud Map and repaired")
	f.StringSliceVar(&o.CloudMapDNSNamespaces, "cloudmap-dns-namespaces", nil, "the only Cloud Map namespaces (by name) --cloudmap-dns registers in (default: any); match the IAM policy's")
	f.BoolVar(&o.Syndicate, "syndicate", false, "replicate Services and their endpoints straight to the peer clusters in --peers-dir")
	f.StringVar(&o.PeersDir, "peers-dir", "/etc/kubeconfigs", "directory of peer kubeconfig files, one per peer, named after the peer's --cluster-name")
	f.BoolVar(&o.CreateNamespaces, "create-namespaces", false, "let replication create a namespace a peer lacks")
	f.DurationVar(&o.PeerGrace, "peer-grace-period", replication.DefaultGrace, "how long replicas from a peer removed from --peers-dir stay")
	f.BoolVar(&o.AllowInsecurePeers, "allow-insecure-peers", false, "let peer kubeconfigs read local files (tokenFile, certificate files), skip TLS verification, use http:// or a proxy-url; off, such a kubeconfig is refused and the peer counts as down")
	f.BoolVar(&o.AllowExecPlugins, "allow-exec-plugins", false, "let peer kubeconfigs run commands for credentials (exec plugins, auth providers); off, such a kubeconfig is refused and the peer counts as down")
	fs := goflag.NewFlagSet("zap", goflag.ContinueOnError)
	zapOpts.BindFlags(fs)
	f.AddGoFlagSet(fs)
	return cmd
}

// envList splits "a,b c" or "[a, b]" into namespaces.
func envList(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '[' || r == ']' || r == '"' })
}

// registryFlags checks the registry flags together and sets what they
// say (from: --registry-migrating-from).
func registryFlags(o *controller.Options, kind, from, phase string) error {
	names := map[string]string{"cloudmap": registry.CloudMap, "hub": registry.Hub}
	hubNeeded := kind == "hub" || from == "hub"
	switch {
	case names[kind] == "":
		return fmt.Errorf("--registry is %q: cloudmap or hub", kind)
	case from != "" && names[from] == "":
		return fmt.Errorf("--registry-migrating-from is %q: cloudmap or hub", from)
	case from == kind:
		return fmt.Errorf("--registry-migrating-from is --registry (%s): name the registry the clusterset moves from", kind)
	case hubNeeded && o.HubKubeconfig == "":
		return fmt.Errorf("the hub registry needs --hub-kubeconfig: the member kubeconfig clustermap hub join wrote")
	case !hubNeeded && o.HubKubeconfig != "":
		return fmt.Errorf("--hub-kubeconfig is set: add --registry=hub to use the hub instead of Cloud Map")
	}
	o.MigratingFrom = names[from]
	switch migrate.Phase(phase) {
	case migrate.Both, migrate.Leaving:
		o.MigrationPhase = migrate.Phase(phase)
	default:
		return fmt.Errorf("--registry-migration-phase is %q: both or leaving", phase)
	}
	return nil
}

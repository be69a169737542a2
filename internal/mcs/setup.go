// Package mcs wires the Multi-Cluster Services mode: this cluster's
// ServiceExports are published to the registry (export), every cluster's
// exports are watched, merged and written as imports (imports). Nothing is
// exported or imported until the cluster's identity is valid.
//
// The circuit, by channel (each a controller-runtime source: what is sent
// on it is reconciled again):
//
//   - the view's events (imports.View.Set, from the registry's watch) ->
//     the import reconciler: a service whose exports changed;
//   - orphans (export.OrphanTap, on the watch's way to the view) -> the
//     export reconciler: this cluster's records with no ServiceExport;
//   - rewrites (observer.WriteFailed, from the registry) -> the export
//     reconciler: an export a write of which failed after it was accepted;
//   - republish (the record format's choice, when it switched) -> the
//     export reconciler: every export, in the new format;
//   - the withdrawal signal (withdraw.Signal, clustermap uninstall) -> the
//     export reconciler: every export, withdrawn.
//
// The gate (clusterid.Gate) holds both reconcilers until the identity is
// read; the observer (observer.go) tells what each registry sees to the
// status Lease, the metrics and Events.
package mcs

import (
	"context"
	"errors"
	"net/http"
	"time"

	servicediscovery "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/clusterid"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/internal/registry/migrate"
	"github.com/clustermap/clustermap/internal/registry/multi"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/internal/telemetry"
	"github.com/clustermap/clustermap/internal/withdraw"
)

// Options of the MCS mode.
type Options struct {
	// Registry, when set, makes the registry of a cluster instead of Cloud
	// Map (tests: a memory registry).
	Registry func(clusterid.Identity) registry.Registry
	// Hub, when set, reaches the hub cluster that is the registry instead
	// of Cloud Map.
	Hub *rest.Config
	// To names the registry written to (registry.CloudMap or
	// registry.Hub; unset: the hub when Hub is set). MigratingFrom, when
	// set, names the one the clusterset moves from: this cluster reads
	// both and, by MigrationPhase, writes both or leaves the old one
	// (docs/hub.md).
	To, MigratingFrom string
	MigrationPhase    migrate.Phase
	// CloudMap is the home Region's client: exports go there. Regions,
	// when set, are every Region the clusterset reads, the home one too.
	CloudMap *servicediscovery.Client
	Regions  []Region
	// Owner, when set, is the account owning the clusterset's shared
	// namespaces; Account is this cluster's.
	Owner, Account string
	Watch          cloudmap.WatchOptions
	// Controller names the writer on Cloud Map records.
	Controller string
	// RecordVersion, when set, is the Cloud Map record format to write
	// instead of this release's: version-skew tests run a cluster as an
	// older (or newer) release would.
	RecordVersion int
	// PerEndpointRecords keeps the per-endpoint record format even when
	// every cluster reads packed records.
	PerEndpointRecords bool
	// MaxImportEndpoints caps each cluster's endpoint records of a service
	// (0: registry.DefaultMaxImportEndpoints).
	MaxImportEndpoints int
	// Usage, when set, counts the clusterset's Cloud Map instances against
	// the quotas (exports past one are refused whole).
	Usage      *cloudmap.Usage
	Namespaces func(string) bool
	// Withdrawal, when requested, withdraws every export (clustermap
	// uninstall).
	Withdrawal *withdraw.Signal
	Recorder   record.EventRecorder
	// Status, when set, hears this cluster's identity once it is valid,
	// each read of the registry, every cluster's proofs of life, and the
	// record format written (the status Lease).
	Status Status
	// Metrics, when set, gets the exports, imports and conflicts gauges.
	Metrics prometheus.Registerer
	Log     logr.Logger
}

// HubSource names a hub registry where the status Lease names a Region.
const HubSource = statuslease.HubSource

// Region is one Region's Cloud Map client.
type Region struct {
	Name   string
	Client *servicediscovery.Client
}

// Setup adds the export and import reconcilers, and the registry watcher
// that starts once the cluster identity is valid.
func Setup(mgr manager.Manager, o Options) error {
	if o.Status == nil {
		o.Status = noStatus{}
	}
	if o.Metrics != nil {
		kube.Register(o.Metrics, objects{mgr.GetCache()})
	}
	gate := &clusterid.Gate{}
	view := imports.NewView()
	orphans := &export.OrphanTap{Cache: mgr.GetClient(), InScope: o.Namespaces, Orphans: make(chan event.GenericEvent, 1024)}
	rewrites := make(chan event.GenericEvent, 1024)
	republish := make(chan event.GenericEvent, 1)
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		id, err := waitIdentity(ctx, mgr.GetAPIReader(), o.Recorder, o.Log)
		if err != nil {
			return nil // ctx ended
		}
		var reg registry.Registry
		var sink registry.Sink = view
		if o.Registry != nil {
			reg = o.Registry(id)
		} else {
			// Orphans are this cluster's exports the registries hold without
			// a ServiceExport here: read from both while migrating.
			orphans.Cluster, orphans.Writer = id.ClusterID, writerMark(ctx, mgr.GetAPIReader(), o.Log)
			sink = orphans.Sink(view)
			// What each registry read sees (a Cloud Map Region, or the hub,
			// which name names) goes to the status Lease, metrics and Events.
			observe := func(source, account, name string) registry.Observer {
				return observer{source: source, account: account, status: o.Status, rewrites: rewrites,
					events: identityEvents{mgr.GetAPIReader(), o.Recorder, id.ClusterID},
					silent: silentEvents(mgr.GetAPIReader(), o.Recorder, name)}
			}
			if reg, err = registryOf(o, registryName(o), id, orphans.Writer, republish, observe); err != nil {
				return err
			}
			if o.MigratingFrom != "" {
				from, err := registryOf(o, o.MigratingFrom, id, orphans.Writer, republish, observe)
				if err != nil {
					return err
				}
				reg = &migrate.Registry{To: reg, From: from, Phase: o.MigrationPhase}
				o.Log.Info("moving the clusterset's registry", "from", o.MigratingFrom, "to", registryName(o), "phase", o.MigrationPhase)
			}
		}
		o.Status.SetCluster(id.ClusterID)
		gate.Open(id, reg)
		o.Log.Info("cluster identity known; exporting and importing", "cluster", id.ClusterID, "clusterset", id.ClusterSet)
		return reg.Watch(ctx, sink)
	})); err != nil {
		return err
	}
	if err := (&export.Reconciler{Client: mgr.GetClient(), Gate: gate, Recorder: o.Recorder, Namespaces: o.Namespaces, Republish: republish,
		Orphans: orphans.Orphans, Orphaned: orphans.Orphaned, APIReader: mgr.GetAPIReader(), Rewrites: rewrites, Withdrawal: o.Withdrawal, Registry: registryName(o)}).SetupWithManager(mgr); err != nil {
		return err
	}
	region := ""
	if o.CloudMap != nil {
		region = o.CloudMap.Options().Region
	}
	if err := (&imports.Reconciler{Client: mgr.GetClient(), Gate: gate, View: view, Recorder: o.Recorder, Namespaces: o.Namespaces, Region: region, MaxEndpoints: o.MaxImportEndpoints}).SetupWithManager(mgr); err != nil {
		return err
	}
	// Ready only with a valid identity: until then nothing is exported. It
	// is read here rather than taken from the gate, which opens on the
	// leader only: a standby replica must be ready too.
	return mgr.AddReadyzCheck("identity", func(r *http.Request) error {
		_, err := clusterid.Read(r.Context(), mgr.GetAPIReader())
		return err
	})
}

// registryOf makes the registry named (registry.Hub or registry.CloudMap)
// for this cluster. Cloud Map's chooses its record format from what it
// reads of Cloud Map alone.
func registryOf(o Options, name string, id clusterid.Identity, writer string, republish chan<- event.GenericEvent,
	observe func(source, account, name string) registry.Observer) (registry.Registry, error) {
	if name == registry.Hub {
		if o.Hub == nil {
			return nil, errors.New("the hub registry needs --hub-kubeconfig")
		}
		return hub.New(o.Hub, hub.Options{ClusterSet: id.ClusterSet, Cluster: id.ClusterID, SilentAfter: o.Watch.SilentAfter,
			MaxImportEndpoints: o.MaxImportEndpoints, Observer: observe(HubSource, "", registry.Hub), Log: o.Log.WithName("hub")})
	}
	if o.CloudMap == nil {
		return nil, errors.New("the Cloud Map registry needs a Cloud Map client (its Region and credentials)")
	}
	formats := &recordfmt.Formats{Cluster: id.ClusterID, PerEndpoint: o.PerEndpointRecords, OnChoice: func(c recordfmt.Choice, switched bool) {
		o.Log.Info("endpoint record format", "format", c.String())
		o.Status.RecordFormat(c.String())
		if !switched {
			return
		}
		select { // every export is written in the new format
		case republish <- event.GenericEvent{Object: &mcsv1beta1.ServiceExport{}}:
		default:
		}
	}}
	reg := cloudMapRegistry(o, id, formats, writer, func(region string) registry.Observer { return observe(region, o.Account, registry.CloudMap) })
	return tapped{reg, formats.Tap}, nil
}

// tapped is a registry whose watch's sink is tapped first.
type tapped struct {
	registry.Registry
	tap func(registry.Sink) registry.Sink
}

func (t tapped) Watch(ctx context.Context, sink registry.Sink) error {
	return t.Registry.Watch(ctx, t.tap(sink))
}

// cloudMapRegistry is the home Region's Cloud Map, or with several
// Regions, every Region's read together and the home one written.
func cloudMapRegistry(o Options, id clusterid.Identity, formats *recordfmt.Formats, writer string, observe func(region string) registry.Observer) registry.Registry {
	backend := func(c *servicediscovery.Client, region string) *cloudmap.Backend {
		telemetry.Reading(region)
		return cloudmap.New(c, cloudmap.Options{ClusterSet: id.ClusterSet, Cluster: id.ClusterID, Controller: o.Controller, Log: o.Log.WithName("cloudmap").WithValues("region", region),
			RecordVersion: o.RecordVersion, MaxImportEndpoints: o.MaxImportEndpoints, Formats: formats, Usage: o.Usage, Owner: o.Owner, Account: o.Account, Watch: o.Watch,
			Writer: writer, Observer: observe(region)})
	}
	home := backend(o.CloudMap, o.CloudMap.Options().Region)
	if len(o.Regions) <= 1 {
		return home
	}
	m := &multi.Registry{Home: home}
	for _, r := range o.Regions {
		src := registry.Registry(home)
		if r.Client != o.CloudMap {
			src = backend(r.Client, r.Name)
		}
		m.Sources = append(m.Sources, multi.Source{Name: r.Name, Registry: src})
	}
	return m
}

// registryName names the registry o writes to, for users.
func registryName(o Options) string {
	if o.To != "" {
		return o.To
	}
	if o.Hub != nil {
		return registry.Hub
	}
	return registry.CloudMap
}

// silentEvents tells, on this cluster's ClusterProperty, that another
// cluster is drained for silence, or restored; registryName is where its
// proofs of life go.
func silentEvents(c client.Reader, rec record.EventRecorder, registryName string) func(string, time.Time, bool) {
	return func(cluster string, lastProof time.Time, silent bool) {
		cp := &aboutv1alpha1.ClusterProperty{}
		if c.Get(context.Background(), client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, cp) != nil {
			return
		}
		if silent {
			rec.Eventf(cp, corev1.EventTypeWarning, "ClusterDrained",
				"cluster %s has not proved alive since %s (past --silent-cluster-ttl) while others did: its endpoints stay imported here but are not routed to; it lost access to %s, its controller is down, or it is gone (docs/troubleshooting.md)",
				cluster, lastProof.UTC().Format(time.RFC3339), registryName)
			return
		}
		rec.Eventf(cp, corev1.EventTypeNormal, "ClusterRestored", "cluster %s proved alive again (or its record went): its endpoints are routed to again", cluster)
	}
}

// writerMark is this installation's mark on its records, from the
// kube-system namespace's UID; none (no duplicate check) when unreadable.
func writerMark(ctx context.Context, c client.Reader, log logr.Logger) string {
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: "kube-system"}, ns); err != nil || ns.UID == "" {
		log.Error(err, "reading the kube-system namespace's UID: a second cluster using this cluster's id will not be detected")
		return ""
	}
	return cloudmap.WriterMark(string(ns.UID))
}

// identityEvents tell, on this cluster's ClusterProperty, of records whose
// writer is not who they claim.
type identityEvents struct {
	c       client.Reader
	rec     record.EventRecorder
	cluster string
}

// Events of records whose writer is not who they claim.
const (
	ReasonDuplicateClusterID   = "DuplicateClusterID"
	ReasonForeignRecordRefused = "ForeignRecordRefused"
)

func (ev identityEvents) warn(reason, format string, args ...any) {
	cp := &aboutv1alpha1.ClusterProperty{}
	if ev.c.Get(context.Background(), client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, cp) != nil {
		return
	}
	ev.rec.Eventf(cp, corev1.EventTypeWarning, reason, format, args...)
}

// duplicate: another cluster writes records under this cluster's id.
func (ev identityEvents) duplicate(key registry.Key, other string) {
	ev.warn(ReasonDuplicateClusterID,
		"another cluster (installation %s) writes Cloud Map records under this cluster's id %s (seen on %s): the two overwrite each other's exports; give each cluster its own id.k8s.io ClusterProperty (docs/troubleshooting.md)",
		other, ev.cluster, key)
}

// foreign: another account's records under a cluster bound to an account.
func (ev identityEvents) foreign(f registry.ForeignRecord) {
	ev.warn(ReasonForeignRecordRefused,
		"records of cluster %s on %s were created by AWS account %s, but that cluster's records are created by account %s: refused, not imported; account %s writes under a name not its own (a misconfigured cluster id, or a hostile member) (docs/troubleshooting.md)",
		f.Cluster, f.Key, f.CreatedBy, f.Bound, f.CreatedBy)
}

// ReasonKeptPacked: an export written packed though some clusters read
// only per-endpoint records (it would not fit those).
const ReasonKeptPacked = "KeptPacked"

// keptPacked says so on the ServiceExport.
func (ev identityEvents) keptPacked(key registry.Key, msg string) {
	se := &mcsv1beta1.ServiceExport{}
	if ev.c.Get(context.Background(), client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, se) != nil {
		return
	}
	ev.rec.Event(se, corev1.EventTypeWarning, ReasonKeptPacked, msg)
}

// identityPoll is how often the ClusterProperties are read until valid.
const identityPoll = 2 * time.Second

// waitIdentity polls the ClusterProperties until they are valid, saying
// why not (log, Event on the ClusterProperty, readiness) each time the
// reason changes.
func waitIdentity(ctx context.Context, c client.Reader, rec record.EventRecorder, log logr.Logger) (clusterid.Identity, error) {
	var id clusterid.Identity
	last := ""
	err := wait.PollUntilContextCancel(ctx, identityPoll, true, func(ctx context.Context) (bool, error) {
		var err error
		if id, err = clusterid.Read(ctx, c); err == nil {
			return true, nil
		}
		if err.Error() != last {
			last = err.Error()
			log.Error(err, "not exporting or importing until the cluster identity is valid")
			for _, name := range []string{aboutv1alpha1.ClusterIDProperty, aboutv1alpha1.ClusterSetProperty} {
				cp := &aboutv1alpha1.ClusterProperty{}
				if c.Get(ctx, client.ObjectKey{Name: name}, cp) == nil {
					rec.Event(cp, corev1.EventTypeWarning, "InvalidClusterIdentity", err.Error())
				}
			}
		}
		return false, nil
	})
	return id, err
}

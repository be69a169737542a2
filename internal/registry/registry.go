// Package registry holds what one cluster publishes about one exported
// service (an Export) and the Registry that shares exports across a
// clusterset.
package registry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// Names of the registries where users read them: messages and Event
// reasons say which one failed or went silent.
const (
	CloudMap = "Cloud Map"
	Hub      = "the hub"
)

// Key names a service across the clusterset (namespace sameness).
type Key struct {
	Namespace, Name string
}

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Export is one cluster's export of one service.
type Export struct {
	ClusterSet, Cluster string
	Key
	Type                  mcsv1beta1.ServiceImportType
	Ports                 []mcsv1beta1.ServicePort
	SessionAffinity       corev1.ServiceAffinity
	SessionAffinityConfig *corev1.SessionAffinityConfig
	IPFamilies            []corev1.IPFamily
	InternalTrafficPolicy *corev1.ServiceInternalTrafficPolicy
	TrafficDistribution   *string
	Labels, Annotations   map[string]string
	// Created is the ServiceExport's creation time: the oldest export wins
	// conflicts.
	Created   time.Time
	Endpoints []Endpoint
	// Foreign marks an export written by another controller (the AWS Cloud
	// Map MCS controller), whose service-level fields are derived from its
	// endpoint records.
	Foreign bool
	// Invalid lists the registry records of this export that were skipped
	// because they do not decode to a valid endpoint or service (at most
	// MaxInvalidRecords, then one that counts the rest: CapInvalid).
	Invalid []InvalidRecord
	// Capped, when set, is the cap (endpoint records per cluster and
	// Service, --max-import-endpoints) this export was cut at: the
	// endpoints past it were not read.
	Capped int
	// RecordVersion is the record format the exporting cluster writes (0
	// when it writes none of clustermap's, as the AWS controller).
	RecordVersion int
	// Newer, when set, says the records are in a format newer than this
	// release knows: read as far as it could.
	Newer string
	// Writer is the installation that wrote the export's service record
	// (a mark no two clusters share), when it says.
	Writer string
	// Region is the Region of the registry the export was read from: each
	// cluster exports to its own Region's (empty where a registry has none).
	Region string
	// Silent, when set, is the last proof of life of a cluster drained for
	// silence: its endpoints are kept, not routed to, until it proves
	// alive again.
	Silent time.Time
}

// DefaultMaxImportEndpoints is how many endpoint records (an address and
// a port each) of one cluster's export of a Service an importer reads: a
// Service of 5,000 dual-stack pods with 2 ports is 20,000. A member's
// records cannot make an importer hold or write more than this per
// cluster, however few bytes they take.
const DefaultMaxImportEndpoints = 20_000

// MaxInvalidRecords is how many skipped records an export says one by one.
const MaxInvalidRecords = 20

// CapInvalid keeps the first MaxInvalidRecords of records and one that
// counts the rest.
func CapInvalid(records []InvalidRecord) []InvalidRecord {
	if len(records) <= MaxInvalidRecords {
		return records
	}
	more := len(records) - MaxInvalidRecords
	return append(records[:MaxInvalidRecords:MaxInvalidRecords], InvalidRecord{Reason: fmt.Sprintf("%d more records skipped", more)})
}

// InvalidRecord is a registry record that was skipped, and why.
type InvalidRecord struct {
	ID, Reason string
	// Cluster, when set, is the cluster the record claims, which exports
	// nothing here: its records are said on another cluster's export.
	Cluster string
}

// Endpoint is one address and port of an exported service; the registry
// keeps one record per pair, as the AWS controller does.
type Endpoint struct {
	IP       string
	Port     int32
	PortName string
	Protocol corev1.Protocol
	Ready    bool
	// Serving and Terminating are the EndpointSlice conditions; a record
	// that does not say has Serving as Ready and Terminating false.
	Serving, Terminating bool
	Hostname             string
	NodeName             string
	// Zone is the endpoint's zone: its node's zone id where the node has
	// one (topology.k8s.aws/zone-id, the same zone in every account),
	// else the zone its EndpointSlice says.
	Zone string
	// ServicePort is the service port this endpoint port serves.
	ServicePort mcsv1beta1.ServicePort
	// TargetPort is the service port's targetPort, as written.
	TargetPort string
}

// SortEndpoints orders endpoints by address, port and protocol (stable):
// one export always reads, packs and digests the same way.
func SortEndpoints(eps []Endpoint) {
	sort.SliceStable(eps, func(i, j int) bool {
		a, b := eps[i], eps[j]
		if a.IP != b.IP {
			return a.IP < b.IP
		}
		if a.Port != b.Port {
			return a.Port < b.Port
		}
		return a.Protocol < b.Protocol
	})
}

// Registry shares exports across the clusters of a clusterset: each
// cluster publishes and withdraws its own, and watches everyone's. Cloud
// Map in one account and Region is one implementation, a hub cluster
// (package hub) another, memory a third for tests;
// several registries compose behind this seam.
type Registry interface {
	// Publish makes the registry hold exactly this export for its cluster,
	// changing only what differs.
	Publish(ctx context.Context, e Export) error
	// Withdraw removes this cluster's export of a service, and the
	// registry's service and namespace when they are empty and ours.
	Withdraw(ctx context.Context, key Key) error
	// Watch tells sink what the registry holds, and every change, until
	// ctx ends. What this cluster publishes or withdraws is read back soon
	// after (its import follows its export).
	Watch(ctx context.Context, sink Sink) error
	// Check asks the watch to read a service this cluster imports that it
	// has not told of since it started, as a known export: only reads
	// that confirm its absence make the sink hear it is exported nowhere,
	// never a listing that left it out (a wrong Region or account lists
	// nothing). Without a running watch it does nothing.
	Check(key Key)
}

// Located is a registry that says which Region this cluster is in (a
// hub, whose admin names each member's Region), for local-first routing.
// Empty: it does not know.
type Located interface {
	Region() string
}

// Sink hears positive knowledge from a registry's Watch. A registry never
// calls Set because of an error: a failed read is Unreadable, and what
// depends on the service stays as it is.
type Sink interface {
	// Set gives every cluster's exports of a service in this clusterset
	// (none: the service is exported nowhere).
	Set(key Key, exports []Export)
	// Unreadable says a service's read failed: keep its imports until Set.
	Unreadable(key Key)
	// Synced says every service was read once (or its read failed): an
	// absent service is now exported nowhere, not unread.
	Synced()
}

// ErrPending says an asynchronous registry change has not finished yet:
// come back soon.
var ErrPending = errors.New("waiting for the registry to finish deregistering")

// Refusal is how the registry refuses an export for now: what the
// export's Ready condition and its Warning Event say, when to publish
// again, and what fixes it (empty: it fixes itself).
type Refusal struct {
	Reason  mcsv1beta1.ServiceExportConditionReason
	Event   string
	Message string
	Retry   time.Duration
	Fix     string
}

// Refused is an error that says how the registry refuses the export.
type Refused interface {
	error
	Refusal() Refusal
}

// LateFailureError says a write of the export was accepted by the registry
// and failed later: it was written again, and the export is not whole
// until a later write succeeds.
type LateFailureError struct{ Reason string }

func (e *LateFailureError) Error() string { return e.Reason }

// Refusal: published again about an operation's time apart until a write
// succeeds (the export is queued at once when one does).
func (e *LateFailureError) Refusal() Refusal {
	return Refusal{Reason: mcsv1beta1.ServiceExportReasonPending, Event: "CloudMapWriteFailed",
		Message: e.Reason + "; written again, waiting for a write to succeed", Retry: LateFailureRetry}
}

// LateFailureRetry is how often an export whose write failed after the
// registry accepted it is written again until a write succeeds: about a
// Cloud Map operation's time.
const LateFailureRetry = 5 * time.Second

// LimitError reports an export the registry cannot hold (a quota); it
// stays refused until the export changes, or room is made.
type LimitError struct {
	Reason string
	// Retry, when set, is when to look again: the registry met the quota
	// midway, while other clusters wrote too. Each cluster is given its
	// own time, so that their next tries do not meet again.
	Retry time.Duration
}

func (e *LimitError) Error() string { return e.Reason }

// Refusal: looked at again each minute, or at Retry; the export's change
// fixes it.
func (e *LimitError) Refusal() Refusal {
	return Refusal{Reason: mcsv1beta1.ServiceExportReasonFailed, Event: "CloudMapQuota", Message: e.Reason, Retry: cmp.Or(e.Retry, time.Minute),
		Fix: "fewer endpoints, or a quota raised where Cloud Map allows (docs/scale.md)"}
}

// NotSharedError says a namespace the export needs belongs to another AWS
// account and is not shared with this cluster's account (not yet, or no
// longer): only the owner's AWS RAM share can fix it.
type NotSharedError struct {
	Namespace, Owner, Account string
}

// ReasonNamespaceNotShared is the Ready reason (and Event reason) of an
// export whose Cloud Map namespace another account owns and has not shared
// with this one.
const ReasonNamespaceNotShared mcsv1beta1.ServiceExportConditionReason = "NamespaceNotShared"

// NotSharedRetry is how often an export waiting for a share is tried
// again; the registry asks Cloud Map at most every few seconds for all of
// them together.
const NotSharedRetry = 10 * time.Second

// Refusal: only the owner account's RAM share fixes it; nothing is touched
// meanwhile, and the export is tried again now and then.
func (e *NotSharedError) Refusal() Refusal {
	return Refusal{Reason: ReasonNamespaceNotShared, Event: string(ReasonNamespaceNotShared), Message: e.Error(), Retry: NotSharedRetry,
		Fix: "account " + e.Owner + " adds namespace " + e.Namespace + " to the clusterset's AWS RAM resource share"}
}

func (e *NotSharedError) Error() string {
	return fmt.Sprintf("Cloud Map namespace %q of account %s is not shared with this cluster's account %s: "+
		"the owner account must add it to the clusterset's AWS RAM resource share (docs/accounts-and-regions.md)", e.Namespace, e.Owner, e.Account)
}

// SinkFuncs is a Sink made of functions; a nil one ignores what it hears.
type SinkFuncs struct {
	OnSet        func(Key, []Export)
	OnUnreadable func(Key)
	OnSynced     func()
}

func (s SinkFuncs) Set(key Key, exports []Export) {
	if s.OnSet != nil {
		s.OnSet(key, exports)
	}
}

func (s SinkFuncs) Unreadable(key Key) {
	if s.OnUnreadable != nil {
		s.OnUnreadable(key)
	}
}

func (s SinkFuncs) Synced() {
	if s.OnSynced != nil {
		s.OnSynced()
	}
}

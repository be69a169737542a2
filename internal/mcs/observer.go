package mcs

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/telemetry"
)

// Status is what the controller's status Lease hears of the MCS mode
// (statuslease.Reporter): this cluster's id, each read of a registry, every
// cluster's proofs of life, and the record format written.
type Status interface {
	SetCluster(id string)
	CloudMapRead(source string, err error)
	SetProofs(source string, proofs map[string]time.Time, drained map[string]bool)
	RecordFormat(format string)
}

type noStatus struct{}

func (noStatus) SetCluster(string)                                       {}
func (noStatus) CloudMapRead(string, error)                              {}
func (noStatus) SetProofs(string, map[string]time.Time, map[string]bool) {}
func (noStatus) RecordFormat(string)                                     {}

// observer tells what one registry read (a Cloud Map Region, or the hub:
// source) sees to the status Lease, the metrics and Events.
type observer struct {
	source string
	// account, with Cloud Map, names this cluster's account in the
	// status Lease's source of each read.
	account  string
	status   Status
	events   identityEvents
	silent   func(cluster string, lastProof time.Time, silent bool)
	rewrites chan<- event.GenericEvent
}

var _ registry.Observer = observer{}

func (ob observer) Read(err error) {
	source := ob.source
	if ob.account != "" {
		source += "/" + ob.account
	}
	ob.status.CloudMapRead(source, err)
	if err == nil {
		telemetry.Synced(telemetry.ModeMCS, ob.source, time.Now())
	}
}

func (ob observer) Proofs(proofs map[string]time.Time, drained map[string]bool) {
	ob.status.SetProofs(ob.source, proofs, drained)
}

func (ob observer) Silent(cluster string, lastProof time.Time, silent bool) {
	ob.silent(cluster, lastProof, silent)
}

func (ob observer) Propagated(took time.Duration) { telemetry.Propagated(ob.source, took) }

func (ob observer) PollPages(pages int) { telemetry.PollPages(ob.source, pages) }

func (ob observer) Duplicate(key registry.Key, other string) {
	telemetry.DuplicateClusterID(ob.source)
	ob.events.duplicate(key, other)
}

func (ob observer) Foreign(f registry.ForeignRecord) { ob.events.foreign(f) }

func (ob observer) KeptPacked(key registry.Key, msg string) { ob.events.keptPacked(key, msg) }

// WriteFailed publishes the export again, which says so.
func (ob observer) WriteFailed(key registry.Key) {
	select {
	case ob.rewrites <- event.GenericEvent{Object: &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
	default:
	}
}

// Package registry holds what one cluster publishes about one exported
// service (an Export) and the Registry that shares exports across a
// clusterset.
package registry

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
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
	// because they do not decode to a valid endpoint or service.
	Invalid []InvalidRecord
	// RecordVersion is the record format the exporting cluster writes (0
	// when it writes none of clustermap's, as the AWS controller).
	RecordVersion int
	// Newer, when set, says the records are in a format newer than this
	// release knows: read as far as it could.
	Newer string
}

// InvalidRecord is a registry record that was skipped, and why.
type InvalidRecord struct {
	ID, Reason string
}

// Endpoint is one address and port of an exported service; the registry
// keeps one record per pair, as the AWS controller does.
type Endpoint struct {
	IP       string
	Port     int32
	PortName string
	Protocol corev1.Protocol
	Ready    bool
	Hostname string
	NodeName string
	// ServicePort is the service port this endpoint port serves.
	ServicePort mcsv1beta1.ServicePort
	// TargetPort is the service port's targetPort, as written.
	TargetPort string
}

// Registry shares exports across the clusters of a clusterset.
type Registry interface {
	// Publish makes the registry hold exactly this export for its cluster,
	// changing only what differs.
	Publish(ctx context.Context, e Export) error
	// Withdraw removes this cluster's export of a service, and the
	// registry's service and namespace when they are empty and ours.
	Withdraw(ctx context.Context, key Key) error
}

// ErrPending says an asynchronous registry change has not finished yet:
// come back soon.
var ErrPending = errors.New("waiting for the registry to finish deregistering")

// LimitError reports an export the registry cannot hold (a quota); it
// stays refused until the export changes.
type LimitError struct{ Reason string }

func (e *LimitError) Error() string { return e.Reason }

// Package statuslease publishes how the controller is doing where `clustermap
// status` can read it with kubectl's access alone: a Lease in the
// controller's namespace whose annotations say when Cloud Map was last read
// successfully, the last error, and which peers are down. It is written at
// most once a minute, and at once when something changes.
package statuslease

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LeaseName is the status Lease, in the controller's namespace.
const LeaseName = "clustermap-status"

// Annotations of the status Lease.
const (
	AnnotationCluster     = "clustermap.io/cluster"
	AnnotationVersion     = "clustermap.io/version"
	AnnotationModes       = "clustermap.io/modes"
	AnnotationLastSync    = "clustermap.io/cloudmap-last-sync"
	AnnotationCloudMapErr = "clustermap.io/cloudmap-error"
	// AnnotationSources is each Cloud Map source's (Region/account) last
	// sync and error, as JSON: {"us-east-1/111111111111": {"lastSync": ..., "error": ...}}.
	AnnotationSources   = "clustermap.io/cloudmap-sources"
	AnnotationPeersDown = "clustermap.io/peers-down"
	// AnnotationRecordFormat is how the cluster writes its Cloud Map
	// endpoint records, and why ("packed: ...").
	AnnotationRecordFormat = "clustermap.io/record-format"
	// AnnotationInstances is the fullest Cloud Map service and namespace
	// against their quotas.
	AnnotationInstances    = "clustermap.io/cloudmap-instances"
	AnnotationHeartbeatSec = "clustermap.io/heartbeat-seconds"
	// AnnotationProofs is every exporting cluster's last proof of life as
	// this cluster read it, and whether it is drained (JSON, by cluster).
	AnnotationProofs = "clustermap.io/cluster-proofs"
)

// ManagedByLabel and ManagedBy mark a status namespace the controller
// created itself.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "clustermap"
)

// Heartbeat is how often an unchanged report is written again.
const Heartbeat = time.Minute

// Reporter gathers the report; its Start writes it.
type Reporter struct {
	Client client.Client
	// Reader reads the Lease uncached (no informer on every Lease).
	Reader    client.Reader
	Namespace string
	Holder    string // the pod, or the process
	Version   string
	Modes     []string
	Log       logr.Logger
	// PeersDown, when set, lists the syndicate peers that are down.
	PeersDown func() []string
	// Quota, when set, tells the Cloud Map instances against the quotas.
	Quota func() string
	// CreateNamespace creates Namespace when it is missing: a controller
	// run outside the cluster (--kubeconfig) has no install that made it,
	// and its status belongs where clustermap status looks.
	CreateNamespace bool

	mu      sync.Mutex
	cluster string
	format  string
	sources map[string]*Source
	proofs  map[string]map[string]Proof // by source, by cluster
	changed chan struct{}
}

// Proof is a cluster's last proof of life, and whether it is drained for
// silence.
type Proof struct {
	Last    time.Time `json:"last"`
	Drained bool      `json:"drained,omitempty"`
}

// SetProofs records every cluster's last proof as one source (a Region)
// read it; drained ones are written at once, new proofs with the heartbeat.
func (r *Reporter) SetProofs(source string, proofs map[string]time.Time, drained map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proofs == nil {
		r.proofs = map[string]map[string]Proof{}
	}
	m := map[string]Proof{}
	for c, t := range proofs {
		m[c] = Proof{Last: t.UTC(), Drained: drained[c]}
	}
	before := r.proofs[source]
	r.proofs[source] = m
	for c, p := range m {
		if before[c].Drained != p.Drained {
			r.poke()
			return
		}
	}
}

// HubSource is the source name of a hub registry (where a Cloud Map
// source names its Region and account).
const HubSource = "hub"

// Source is how reading one Cloud Map source (a Region, as an account) went.
type Source struct {
	LastSync *time.Time `json:"lastSync,omitempty"`
	Error    string     `json:"error,omitempty"`
}

// SetCluster names the cluster once its identity is known.
func (r *Reporter) SetCluster(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cluster != id {
		r.cluster = id
		r.poke()
	}
}

// CloudMapRead records the outcome of one read of a Cloud Map source
// (its Region and account, "us-east-1/111111111111").
func (r *Reporter) CloudMapRead(source string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sources == nil {
		r.sources = map[string]*Source{}
	}
	s := r.sources[source]
	if s == nil {
		s = &Source{}
		r.sources[source] = s
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	} else {
		now := time.Now().UTC().Truncate(time.Second)
		s.LastSync = &now
	}
	// A change between working and failing is written at once; a new
	// message while failing (each names its request) waits for the
	// heartbeat.
	if (msg == "") != (s.Error == "") {
		r.poke()
	}
	s.Error = msg
}

// RecordFormat records how this cluster writes its endpoint records.
func (r *Reporter) RecordFormat(format string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.format != format {
		r.format = format
		r.poke()
	}
}

func (r *Reporter) poke() {
	if r.changed == nil {
		r.changed = make(chan struct{}, 1)
	}
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *Reporter) annotations() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := map[string]string{
		AnnotationCluster: r.cluster, AnnotationVersion: r.Version, AnnotationModes: strings.Join(r.Modes, ","),
		AnnotationCloudMapErr: "", AnnotationHeartbeatSec: "60",
	}
	// The overall last sync is the oldest source's: one Region behind
	// shows; the error, the first failing source's.
	var oldest *time.Time
	for _, name := range slices.Sorted(maps.Keys(r.sources)) {
		s := r.sources[name]
		if s.Error != "" && a[AnnotationCloudMapErr] == "" {
			a[AnnotationCloudMapErr] = s.Error
		}
		if s.LastSync != nil && (oldest == nil || s.LastSync.Before(*oldest)) {
			oldest = s.LastSync
		}
	}
	if oldest != nil {
		a[AnnotationLastSync] = oldest.Format(time.RFC3339)
	}
	if len(r.sources) > 0 {
		b, _ := json.Marshal(r.sources)
		a[AnnotationSources] = string(b)
	}
	if r.Quota != nil {
		a[AnnotationInstances] = r.Quota()
	}
	if r.format != "" {
		a[AnnotationRecordFormat] = r.format
	}
	if r.PeersDown != nil {
		a[AnnotationPeersDown] = strings.Join(r.PeersDown(), ",")
	}
	if len(r.proofs) > 0 {
		// Each cluster's newest proof over the Regions, drained where any
		// Region drains it.
		all := map[string]Proof{}
		for _, m := range r.proofs {
			for c, p := range m {
				q := all[c]
				if p.Last.After(q.Last) {
					q.Last = p.Last
				}
				q.Drained = q.Drained || p.Drained
				all[c] = q
			}
		}
		b, _ := json.Marshal(all)
		a[AnnotationProofs] = string(b)
	}
	return a
}

// Start writes the report until ctx ends (a controller-runtime Runnable,
// run by the leader: the replica doing the work).
func (r *Reporter) Start(ctx context.Context) error {
	r.mu.Lock()
	r.poke()
	changed := r.changed
	r.mu.Unlock()
	warned := false
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	var last map[string]string
	var lastWrite time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
		a := r.annotations()
		if signature(a) == signature(last) && time.Since(lastWrite) < Heartbeat {
			continue
		}
		if err := r.write(ctx, a); err != nil {
			if !warned {
				r.Log.Info("cannot publish the status Lease; clustermap status will not see this controller", "namespace", r.Namespace, "error", err.Error())
				warned = true
			}
			continue
		}
		last, lastWrite = a, time.Now()
	}
}

// signature is what a report says, less what changes on every read (the
// time of the last sync, once there was one; the wording of the last
// error): a change of it is written at once, the rest with the heartbeat.
func signature(a map[string]string) string {
	if a == nil {
		return ""
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(a)) {
		v := a[k]
		switch k {
		case AnnotationLastSync:
			v = "synced" // the first sync is news, later ones are not
		case AnnotationSources:
			v = sourcesSignature(v)
		case AnnotationInstances:
			v = "" // counts move with every export: the heartbeat carries them
		case AnnotationProofs:
			v = drainedSignature(v)
		case AnnotationCloudMapErr:
			if v != "" {
				v = "failing"
			}
		}
		b.WriteString(k + "=" + v + "\n")
	}
	return b.String()
}

// drainedSignature is which clusters are drained.
func drainedSignature(v string) string {
	var proofs map[string]Proof
	if json.Unmarshal([]byte(v), &proofs) != nil {
		return v
	}
	var drained []string
	for _, c := range slices.Sorted(maps.Keys(proofs)) {
		if proofs[c].Drained {
			drained = append(drained, c)
		}
	}
	return strings.Join(drained, ",")
}

// sourcesSignature is which sources synced and which fail.
func sourcesSignature(v string) string {
	var sources map[string]Source
	if json.Unmarshal([]byte(v), &sources) != nil {
		return v
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(sources)) {
		s := sources[name]
		b.WriteString(fmt.Sprintf("%s:%v:%v;", name, s.LastSync != nil, s.Error != ""))
	}
	return b.String()
}

func (r *Reporter) write(ctx context.Context, a map[string]string) error {
	now := metav1.NewMicroTime(time.Now())
	holder := r.Holder
	lease := &coordinationv1.Lease{}
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: LeaseName}, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: LeaseName, Annotations: a},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now}}
		err = r.Client.Create(ctx, lease)
		if apierrors.IsNotFound(err) && r.CreateNamespace {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace, Labels: map[string]string{ManagedByLabel: ManagedBy}}}
			if err := r.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating the status namespace %s (or pass --status-namespace): %w", r.Namespace, err)
			}
			r.Log.Info("created the status namespace: this controller runs outside the cluster", "namespace", r.Namespace)
			lease.ResourceVersion = ""
			err = r.Client.Create(ctx, lease)
		}
		return err
	}
	if err != nil {
		return err
	}
	lease.Annotations = a
	lease.Spec.HolderIdentity, lease.Spec.RenewTime = &holder, &now
	return r.Client.Update(ctx, lease)
}

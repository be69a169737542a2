package imports

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/conditions"
	"github.com/clustermap/clustermap/internal/merge"
	"github.com/clustermap/clustermap/internal/registry"
)

// What an import says of itself: its conditions, and Events on it and on
// this cluster's export of the service.

// readyCondition is the import's Ready condition after its writes.
func readyCondition(generation int64, err error) metav1.Condition {
	c := metav1.Condition{Type: string(mcsv1beta1.ServiceImportConditionReady), Status: metav1.ConditionTrue,
		Reason: string(mcsv1beta1.ServiceImportReasonReady), Message: "the import's derived Service and EndpointSlices are written", ObservedGeneration: generation}
	switch {
	case errors.Is(err, errFamilyNotSupported):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(mcsv1beta1.ServiceImportReasonIPFamilyNotSupported), err.Error()
	case err != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(mcsv1beta1.ServiceImportReasonPending), err.Error()+" (retried)"
	}
	return c
}

// reportInvalid says, with a Warning Event on the import, which registry
// records were skipped (the valid endpoints import without them), and which
// clusters write a record format newer than this release's.
func (r *Reconciler) reportInvalid(si *mcsv1beta1.ServiceImport, key registry.Key, exports []registry.Export) {
	type said struct{ reason, msg string }
	var msgs []said
	for _, e := range exports {
		for _, inv := range e.Invalid {
			cluster, exportsNothing := e.Cluster, ""
			if inv.Cluster != "" {
				cluster, exportsNothing = inv.Cluster, " (the cluster exports nothing else here, so it is not among the exporters)"
			}
			if inv.ID == "" { // registry.CapInvalid's count of the rest
				msgs = append(msgs, said{"InvalidRecord", fmt.Sprintf("cluster %s: %s", cluster, inv.Reason)})
				continue
			}
			msgs = append(msgs, said{"InvalidRecord", fmt.Sprintf("cluster %s exports a record that was skipped: instance %s: %s (fix or deregister that instance)%s", cluster, inv.ID, inv.Reason, exportsNothing)})
		}
		if e.Capped > 0 {
			msgs = append(msgs, said{ConditionEndpointsCapped, cappedMessage(e)})
		}
		if e.Newer != "" {
			msgs = append(msgs, said{"NewerRecordFormat", fmt.Sprintf("cluster %s writes %s: imported as far as this release can read it; upgrade clustermap in this cluster", e.Cluster, e.Newer)})
		}
	}
	var sig strings.Builder
	for _, m := range msgs {
		sig.WriteString(m.msg + "\n")
	}
	if old, _ := r.invalidSaid.Load(key); old == sig.String() || (old == nil && sig.Len() == 0) {
		return
	}
	r.invalidSaid.Store(key, sig.String())
	for _, m := range msgs {
		r.Recorder.Event(si, corev1.EventTypeWarning, m.reason, m.msg)
	}
}

// reportConflicts sets the Conflict condition on this cluster's export of
// the service, if it exports it: every cluster sees the same merge, so every
// disagreeing export in every cluster gets it.
func (r *Reconciler) reportConflicts(ctx context.Context, key registry.Key, m merge.Result) error {
	id, _, _ := r.Gate.Get()
	exporting := false
	for _, e := range m.Exports {
		exporting = exporting || e.Cluster == id.ClusterID
	}
	if !exporting {
		return nil
	}
	se := &mcsv1beta1.ServiceExport{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, se); err != nil {
		return client.IgnoreNotFound(err)
	}
	cond := metav1.Condition{Type: string(mcsv1beta1.ServiceExportConditionConflict), Status: metav1.ConditionFalse,
		Reason: m.ConflictReason(), Message: "the exports of all clusters agree", ObservedGeneration: se.Generation}
	if len(m.Conflicts) > 0 {
		cond.Status = metav1.ConditionTrue
		cond.Message = fmt.Sprintf("the exporting clusters %v disagree (%s); the oldest export (cluster %s) wins", m.Clusters(), m.ConflictReason(), m.Exports[0].Cluster)
	}
	if !meta.SetStatusCondition(&se.Status.Conditions, cond) {
		return nil
	}
	if cond.Status == metav1.ConditionTrue {
		r.Recorder.Event(se, corev1.EventTypeWarning, "Conflict", cond.Message)
	}
	return conditions.Apply(ctx, r.Client, se, conditions.ImportManager, mcsv1beta1.ServiceExportConditionConflict)
}

// ConditionEndpointsCapped names, on a ServiceImport, the exporting
// clusters whose endpoints passed the import cap (--max-import-endpoints):
// imported up to it, the rest left out. Absent while none does.
const ConditionEndpointsCapped = "EndpointsCapped"

func cappedMessage(e registry.Export) string {
	return fmt.Sprintf("cluster %s exports more than %d endpoint records (address and port) of this Service: imported up to that many, the rest left out; if the export is genuine, raise --max-import-endpoints (chart: mcs.maxImportEndpoints) in the importing clusters", e.Cluster, e.Capped)
}

// setCapped sets or clears the EndpointsCapped condition (its Events are
// said with the invalid records').
func setCapped(si *mcsv1beta1.ServiceImport, exports []registry.Export, status *mcsv1beta1.ServiceImportStatus) {
	var msgs []string
	for _, e := range exports {
		if e.Capped > 0 {
			msgs = append(msgs, cappedMessage(e))
		}
	}
	if len(msgs) == 0 {
		meta.RemoveStatusCondition(&status.Conditions, ConditionEndpointsCapped)
		return
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionEndpointsCapped, Status: metav1.ConditionTrue,
		Reason: "MaxImportEndpoints", Message: strings.Join(msgs, "; "), ObservedGeneration: si.Generation})
}

// ConditionTrafficDistributionIgnored says, on a ServiceImport whose
// exports ask for local-first routing, that this cluster's API server
// dropped the derived Service's spec.trafficDistribution (Kubernetes
// before 1.31, or 1.30 without its feature gate): requests go evenly over
// every cluster. Absent otherwise.
const ConditionTrafficDistributionIgnored = "TrafficDistributionIgnored"

// reportLocalityDropped sets or clears TrafficDistributionIgnored, with a
// Warning Event when it is set.
func (r *Reconciler) reportLocalityDropped(si *mcsv1beta1.ServiceImport, dropped bool, status *mcsv1beta1.ServiceImportStatus) {
	if !dropped {
		meta.RemoveStatusCondition(&status.Conditions, ConditionTrafficDistributionIgnored)
		return
	}
	msg := "the exports ask for local-first routing, and this cluster's API server dropped the derived Service's spec.trafficDistribution (Kubernetes before 1.31, or 1.30 without the ServiceTrafficDistribution gate): requests go evenly over every cluster's endpoints; upgrade this cluster to Kubernetes 1.31 or later"
	if meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionTrafficDistributionIgnored, Status: metav1.ConditionTrue,
		Reason: "NotSupportedByCluster", Message: msg, ObservedGeneration: si.Generation}) {
		r.Recorder.Event(si, corev1.EventTypeWarning, ConditionTrafficDistributionIgnored, msg)
	}
}

// ConditionClustersDrained names, on a ServiceImport, the exporting
// clusters drained for silence (registry.Export.Silent): listed, their
// endpoints kept but not routed to. Absent while none is.
const ConditionClustersDrained = "ClustersDrained"

// reportDrained sets the ClustersDrained condition and, when the drained
// clusters change, a Warning Event naming them; floored are the silent
// clusters kept routed as the Service's last exporters (drainFloor).
func (r *Reconciler) reportDrained(si *mcsv1beta1.ServiceImport, key registry.Key, exports []registry.Export, floored []string, status *mcsv1beta1.ServiceImportStatus) {
	var drained []string
	for _, e := range exports {
		if !e.Silent.IsZero() {
			drained = append(drained, silentFor(e))
		}
	}
	slices.Sort(drained)
	said := strings.Join(drained, ", ")
	if len(floored) > 0 {
		said = "floor: " + strings.Join(floored, ", ")
	}
	prev, _ := r.drainedSaid.Swap(key, said)
	switch {
	case len(floored) > 0:
		msg := strings.Join(floored, ", ") + ": silent past --silent-cluster-ttl, still routed to: no other cluster exports a ready endpoint of this Service, and draining its last exporters would take it dark everywhere"
		if prev != said {
			r.Recorder.Event(si, corev1.EventTypeWarning, "DrainHeld", msg)
		}
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionClustersDrained, Status: metav1.ConditionFalse,
			Reason: "LastExporters", Message: msg, ObservedGeneration: si.Generation})
		return
	case said == "":
		meta.RemoveStatusCondition(&status.Conditions, ConditionClustersDrained)
		return
	case prev != said:
		r.Recorder.Event(si, corev1.EventTypeWarning, "ClusterDrained", "not routed to, kept in the import: "+said+
			": silent past --silent-cluster-ttl while other clusters proved alive (docs/traffic.md)")
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: ConditionClustersDrained, Status: metav1.ConditionTrue,
		Reason: "ClusterSilent", Message: said + ": endpoints kept, not routed to, until the cluster proves alive again", ObservedGeneration: si.Generation})
}

func silentFor(e registry.Export) string {
	return fmt.Sprintf("%s (last proof of life %s)", e.Cluster, e.Silent.UTC().Format(time.RFC3339))
}

package imports

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// ConditionRemovalHeld is set on an import the registry says is exported
// nowhere while clustermap refuses to believe it (holdRemovals).
const ConditionRemovalHeld = "RemovalHeld"

// How soon an import waiting on a read (checkRetry) or held (heldRetry) is
// looked at again; the view's answer queues it sooner.
const (
	checkRetry = 2 * time.Second
	heldRetry  = 30 * time.Second
)

// holdRemovals says whether removals the registry alone vouches for (of
// imports it said nothing else of since this controller started) must
// wait: when the registry shows no export of any other cluster at all, it
// more likely reads the wrong place (a wrong Region, AWS account or owner
// account lists and reads nothing) than every other cluster unexported
// everything while this one was away. Removals of imports seen exported
// since the start are never held, nor those made while other clusters'
// exports are in sight (services unexported while this cluster was down).
func holdRemovals(unwitnessed int, othersVisible bool) bool {
	return unwitnessed > 0 && !othersVisible
}

// fromOthers says whether an import holds another cluster's export.
func fromOthers(si *mcsv1beta1.ServiceImport, self string) bool {
	for _, c := range si.Status.Clusters {
		if c.Cluster != self {
			return true
		}
	}
	return false
}

// removeChecked removes an import the view says is exported nowhere, once
// that is positive knowledge: a service the registry has not told of since
// the start is read first (Registry.Check), and a removal only the
// registry's word after a restart vouches for waits while no other
// cluster's export is in sight (holdRemovals).
func (r *Reconciler) removeChecked(ctx context.Context, key registry.Key) (reconcile.Result, error) {
	si := &mcsv1beta1.ServiceImport{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, si)
	if client.IgnoreNotFound(err) != nil {
		return reconcile.Result{}, err
	}
	if err != nil || si.Labels[LabelManagedBy] != managedByValue {
		return reconcile.Result{}, r.remove(ctx, key) // leftovers only
	}
	id, reg, _ := r.Gate.Get()
	heard, witnessed := r.View.Heard(key)
	if !heard {
		reg.Check(key)
		return reconcile.Result{RequeueAfter: checkRetry}, nil
	}
	if !witnessed && fromOthers(si, id.ClusterID) {
		unwitnessed, others, pending, err := r.countRemovals(ctx, id.ClusterID)
		if err != nil {
			return reconcile.Result{}, err
		}
		if pending > 0 {
			// Judged once every import was read: one not read yet may be
			// the other clusters' export in sight.
			return reconcile.Result{RequeueAfter: checkRetry}, nil
		}
		if holdRemovals(unwitnessed, r.View.othersVisible(id.ClusterID, regionsOf(si))) {
			return reconcile.Result{RequeueAfter: heldRetry}, r.hold(ctx, si, unwitnessed, others)
		}
	}
	r.heldSaid.Delete(key)
	return reconcile.Result{}, r.remove(ctx, key)
}

// countRemovals counts this cluster's imports of other clusters' exports;
// of those, the ones the registry says are exported nowhere without having
// said they were exported since the start, and the ones it has not told of
// yet (each asked for: Registry.Check). An unreadable one is kept anyway.
func (r *Reconciler) countRemovals(ctx context.Context, self string) (unwitnessed, others, pending int, err error) {
	list := &mcsv1beta1.ServiceImportList{}
	if err := r.Client.List(ctx, list, client.MatchingLabels{LabelManagedBy: managedByValue}); err != nil {
		return 0, 0, 0, err
	}
	_, reg, _ := r.Gate.Get()
	for i := range list.Items {
		si := &list.Items[i]
		if !r.Namespaces(si.Namespace) || !fromOthers(si, self) {
			continue
		}
		others++
		key := registry.Key{Namespace: si.Namespace, Name: si.Name}
		heard, witnessed := r.View.Heard(key)
		switch {
		case !heard && !r.View.isUnreadable(key):
			reg.Check(key)
			pending++
		case heard && !witnessed && len(r.View.Get(key)) == 0:
			unwitnessed++
		}
	}
	return unwitnessed, others, pending, nil
}

// hold keeps an import and says why, on it (a condition, a Warning Event
// once) and in the log.
func (r *Reconciler) hold(ctx context.Context, si *mcsv1beta1.ServiceImport, unwitnessed, others int) error {
	where := ""
	if regions := regionsOf(si); len(regions) > 0 {
		where = " in Region " + strings.Join(regions, ", ") + " (where this import's exports were read)"
	}
	msg := fmt.Sprintf("the registry says %d of the %d services this cluster imports from other clusters are exported nowhere, "+
		"and shows no export of any other cluster%s since this controller started: more likely the controller reads the wrong place "+
		"(--region, --regions, the AWS account of its credentials, --cloudmap-owner-account, a namespace no longer shared) "+
		"than every cluster unexported at once, so they are kept. Fix the configuration, or, if the services really are "+
		"unexported, delete this ServiceImport to confirm (docs/troubleshooting.md#removalheld)", unwitnessed, others, where)
	key := registry.Key{Namespace: si.Namespace, Name: si.Name}
	if _, said := r.heldSaid.LoadOrStore(key, true); !said {
		r.Recorder.Event(si, corev1.EventTypeWarning, ConditionRemovalHeld, msg)
		log.FromContext(ctx).Info("keeping an import the registry says is exported nowhere", "import", key.String(), "reason", msg)
	}
	cond := metav1.Condition{Type: ConditionRemovalHeld, Status: metav1.ConditionTrue, Reason: "ExportedNowhereAfterStart",
		Message: msg, ObservedGeneration: si.Generation}
	status := si.Status.DeepCopy()
	if !meta.SetStatusCondition(&status.Conditions, cond) {
		return nil
	}
	return r.writeImportStatus(ctx, si, *status)
}

// beforeSync says whether an import must wait for the registry's first
// full read: when it would go, or lose a cluster it holds (whose exports
// may be in a Region not read yet). A cluster exports to one Region, so
// the exports of every cluster heard of are whole.
func (r *Reconciler) beforeSync(ctx context.Context, key registry.Key, exports []registry.Export) (bool, error) {
	if len(exports) == 0 {
		return true, nil
	}
	si := &mcsv1beta1.ServiceImport{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, si)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	heard := map[string]bool{}
	for _, e := range exports {
		heard[e.Cluster] = true
	}
	for _, c := range si.Status.Clusters {
		if !heard[c.Cluster] {
			return true, nil
		}
	}
	return false, nil
}

// othersVisible says whether the view holds an export of a cluster other
// than self in each of regions (none named: anywhere). A Region is judged
// alone: exports in sight in one say nothing of another, which a restart
// may have dropped from the configuration or not read right.
func (v *View) othersVisible(self string, regions []string) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	seen := map[string]bool{}
	for _, exports := range v.exports {
		for _, e := range exports {
			if e.Cluster != self {
				seen[e.Region], seen[""] = true, true
			}
		}
	}
	if len(regions) == 0 {
		return seen[""]
	}
	for _, r := range regions {
		if !seen[r] {
			return false
		}
	}
	return true
}

// regionsOf are the Regions an import's exports were last read from
// (none known: an import written before it was said).
func regionsOf(si *mcsv1beta1.ServiceImport) []string {
	if v := si.Annotations[SourceRegionsAnnotation]; v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

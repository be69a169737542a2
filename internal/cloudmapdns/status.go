// What the reconciler writes to Kubernetes: conditions, Events, the
// finalizer and annotations.

package cloudmapdns

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// unmark drops the finalizer and our annotations once the Service is
// registered nowhere, or the annotation naming t once it is withdrawn
// from there.
func (r *Reconciler) unmark(ctx context.Context, svc *corev1.Service, t Target) error {
	all := t == Target{}
	if all && !controllerutil.ContainsFinalizer(svc, Finalizer) && svc.Annotations[AnnotationRegistered] == "" && svc.Annotations[AnnotationOwners] == "" ||
		!all && svc.Annotations[AnnotationRegistered] != t.String() {
		return nil
	}
	return r.patch(ctx, svc, func() {
		delete(svc.Annotations, AnnotationRegistered)
		if all {
			delete(svc.Annotations, AnnotationOwners)
			controllerutil.RemoveFinalizer(svc, Finalizer)
		}
	})
}

// coversOwners reports whether the recorded owners include every one of
// mark's.
func coversOwners(svc *corev1.Service, mark string) bool {
	rec := strings.Fields(svc.Annotations[AnnotationOwners])
	for _, o := range strings.Fields(mark) {
		if !slices.Contains(rec, o) {
			return false
		}
	}
	return true
}

func (r *Reconciler) announce(svc *corev1.Service, changes []Change) {
	for _, c := range changes {
		instancesChanged.WithLabelValues(c.Action).Add(float64(c.Count))
		r.Recorder.Event(svc, corev1.EventTypeNormal, c.Reason, c.Message)
		// And a log line: Events expire after an hour, and a deleted
		// Service's go with it.
		log.Log.WithName("cloudmapdns").Info(c.Message, "service", client.ObjectKeyFromObject(svc).String(), "reason", c.Reason)
	}
}

func (r *Reconciler) patch(ctx context.Context, svc *corev1.Service, change func()) error {
	base := svc.DeepCopy()
	change()
	return r.Client.Patch(ctx, svc, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}

// report sets the Service's condition and, when it changes, emits an Event
// (Warning for failures) so each problem is said once, not on every retry.
func (r *Reconciler) report(ctx context.Context, svc *corev1.Service, status metav1.ConditionStatus, reason, msg string) {
	old := meta.FindStatusCondition(svc.Status.Conditions, ConditionRegistered)
	if old != nil && old.Status == status && old.Reason == reason && old.Message == msg {
		return
	}
	if status == metav1.ConditionFalse {
		r.Recorder.Event(svc, corev1.EventTypeWarning, reason, msg)
	}
	base := svc.DeepCopy()
	meta.SetStatusCondition(&svc.Status.Conditions, metav1.Condition{Type: ConditionRegistered, Status: status, Reason: reason, Message: msg, ObservedGeneration: svc.Generation})
	r.patchStatus(ctx, svc, base)
}

func (r *Reconciler) clearCondition(ctx context.Context, svc *corev1.Service) {
	base := svc.DeepCopy()
	meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionRegistered)
	r.patchStatus(ctx, svc, base)
}

// patchStatus writes the status unless the Service changed meanwhile: the
// change brings another reconcile, which writes it then.
func (r *Reconciler) patchStatus(ctx context.Context, svc, base *corev1.Service) {
	err := r.Client.Status().Patch(ctx, svc, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		log.FromContext(ctx).Error(err, "updating Service status", "service", client.ObjectKeyFromObject(svc))
	}
}

package kube

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/csaupgrade"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v6/typed"
)

// An Applier writes objects by server-side apply as one field manager:
// what it sends is what it owns, a field it stops sending is removed, and
// a field another manager set is left to it. It writes nothing when what
// it owns already holds what it would send.
type Applier struct {
	Client client.Client
	// Manager is the field manager: one per mode.
	Manager string
}

// Intent is what applying planned sends: its fields as planned, without
// status and without what the API server sets (resourceVersion, uid,
// creation time, managed fields).
func (a Applier) Intent(planned client.Object) (*unstructured.Unstructured, error) {
	gvk, err := apiutil.GVKForObject(planned, a.Client.Scheme())
	if err != nil {
		return nil, err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(planned)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	delete(u.Object, "status")
	for _, f := range []string{"creationTimestamp", "resourceVersion", "uid", "managedFields", "generation"} {
		unstructured.RemoveNestedField(u.Object, "metadata", f)
	}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// Holds says whether have (as read) already holds intent as this manager
// applied it: then applying intent again would change nothing.
func (a Applier) Holds(have client.Object, intent *unstructured.Unstructured) (bool, error) {
	owned, err := a.owned(have)
	if err != nil || owned == nil {
		return false, err
	}
	want := intent.DeepCopy().Object
	unstructured.RemoveNestedField(want, "apiVersion")
	unstructured.RemoveNestedField(want, "kind")
	unstructured.RemoveNestedField(owned, "apiVersion")
	unstructured.RemoveNestedField(owned, "kind")
	return equality.Semantic.DeepEqual(want, owned), nil
}

// owned is what have holds of the fields this manager applied (nil: it
// applied none).
func (a Applier) owned(have client.Object) (map[string]any, error) {
	var ac any
	var err error
	switch o := have.(type) {
	case *corev1.Service:
		ac, err = corev1ac.ExtractService(o, a.Manager)
	case *discoveryv1.EndpointSlice:
		ac, err = discoveryv1ac.ExtractEndpointSlice(o, a.Manager)
	default:
		// A custom resource: its schema is not compiled in. The deduced
		// type reads every list as atomic, as the ones applied here are.
		return extractDeduced(have, a.Manager)
	}
	if err != nil {
		return nil, err
	}
	return runtime.DefaultUnstructuredConverter.ToUnstructured(ac)
}

func extractDeduced(have client.Object, manager string) (map[string]any, error) {
	var entry *metav1.ManagedFieldsEntry
	for i, mf := range have.GetManagedFields() {
		if mf.Manager == manager && mf.Operation == metav1.ManagedFieldsOperationApply && mf.Subresource == "" {
			entry = &have.GetManagedFields()[i]
		}
	}
	if entry == nil || entry.FieldsV1 == nil {
		return nil, nil
	}
	set := &fieldpath.Set{}
	if err := set.FromJSON(bytes.NewReader(entry.FieldsV1.Raw)); err != nil {
		return nil, err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(have)
	if err != nil {
		return nil, err
	}
	tv, err := typed.DeducedParseableType.FromUnstructured(m)
	if err != nil {
		return nil, err
	}
	out, ok := tv.ExtractItems(set.Leaves()).AsValue().Unstructured().(map[string]any)
	if !ok {
		return nil, fmt.Errorf("fields of %s applied by %s are not an object", have.GetName(), manager)
	}
	// What names the object is no field anyone owns; an apply sends it.
	if err := unstructured.SetNestedField(out, have.GetName(), "metadata", "name"); err != nil {
		return nil, err
	}
	if have.GetNamespace() != "" {
		if err := unstructured.SetNestedField(out, have.GetNamespace(), "metadata", "namespace"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Apply sends planned's intent unless have (nil: none was read) already
// holds it, taking over any field another manager holds with another
// value, and every field the managers from (and this program's earlier
// releases) wrote by update. It returns the object as stored: the API
// server's answer, or have when nothing was sent.
func (a Applier) Apply(ctx context.Context, have, planned client.Object, from ...string) (client.Object, error) {
	intent, err := a.Intent(planned)
	if err != nil {
		return nil, err
	}
	if have != nil {
		if taken, err := a.TakeOver(ctx, have, "", from...); err != nil {
			return nil, err
		} else if !taken {
			if held, err := a.Holds(have, intent); err != nil || held {
				return have, err
			}
		}
	}
	if err := a.Client.Patch(ctx, intent, client.Apply, client.FieldOwner(a.Manager), client.ForceOwnership); err != nil {
		return nil, err
	}
	stored, err := a.Client.Scheme().New(intent.GroupVersionKind())
	if err != nil {
		return nil, err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(intent.Object, stored); err != nil {
		return nil, err
	}
	return stored.(client.Object), nil
}

// ApplyStatus sends planned's status (have: the object as read; from as
// in Apply) as the manager's status writer, StatusManager: the status is
// a report, owned apart from the fields it reports on.
func (a Applier) ApplyStatus(ctx context.Context, have, planned client.Object, from ...string) error {
	status := Applier{Client: a.Client, Manager: a.StatusManager()}
	if _, err := status.TakeOver(ctx, have, "status", from...); err != nil {
		return err
	}
	gvk, err := apiutil.GVKForObject(planned, a.Client.Scheme())
	if err != nil {
		return err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(planned)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": m["status"]}}
	u.SetGroupVersionKind(gvk)
	u.SetName(planned.GetName())
	u.SetNamespace(planned.GetNamespace())
	return a.Client.Status().Patch(ctx, u, client.Apply, client.FieldOwner(status.Manager), client.ForceOwnership)
}

// StatusManager is the field manager of the status this manager writes.
func (a Applier) StatusManager() string { return a.Manager + "-status" }

// LegacyManager is the field manager of this program's writes that name
// none (creates and updates before server-side apply): the API server
// takes its user agent's first word.
func LegacyManager() string {
	name, _, _ := strings.Cut(rest.DefaultKubernetesUserAgent(), "/")
	return name
}

// TakeOver makes the fields that the managers from, and this program's
// earlier releases (before it applied them), wrote by update this
// manager's, once per object: otherwise a field it stops sending would
// stay, held by those writes. It says whether it did. A conflict (the
// object changed since it was read) leaves it to the next write.
func (a Applier) TakeOver(ctx context.Context, have client.Object, subresource string, from ...string) (bool, error) {
	managers := sets.New(from...)
	if slices.Contains(Updaters(have, subresource), LegacyManager()) {
		managers.Insert(LegacyManager())
	}
	managers.Delete(a.Manager)
	if managers.Len() == 0 {
		return false, nil
	}
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(have, managers, a.Manager, csaupgrade.Subresource(subresource))
	if err != nil || patch == nil {
		return false, err
	}
	obj := have.DeepCopyObject().(client.Object)
	err = a.Client.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, patch))
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Updaters are the field managers that wrote obj (or its subresource) by
// update.
func Updaters(obj client.Object, subresource string) []string {
	var out []string
	for _, mf := range obj.GetManagedFields() {
		if mf.Operation == metav1.ManagedFieldsOperationUpdate && mf.Subresource == subresource && !slices.Contains(out, mf.Manager) {
			out = append(out, mf.Manager)
		}
	}
	return out
}

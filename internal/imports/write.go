package imports

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/conditions"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
)

// The import side's writes: every object is applied (server-side) as
// FieldOwner, so a field it stops planning goes and a field someone else
// adds stays; an object that already holds the plan is not written.

// FieldOwner is the import side's field manager on the ServiceImports,
// derived Services and EndpointSlices it writes.
const FieldOwner = conditions.ImportManager

func (r *Reconciler) applier() kube.Applier {
	return kube.Applier{Client: r.Client, Manager: FieldOwner}
}

// writeImport applies the ServiceImport's labels, annotations and spec as
// planned (have: as read, nil when there is none). One the AWS controller
// made is taken over whole: its fields become clustermap's, so those
// clustermap does not plan go. One that clustermap did not make, nor can
// take over, is an error.
func (r *Reconciler) writeImport(ctx context.Context, have, want *mcsv1beta1.ServiceImport) (*mcsv1beta1.ServiceImport, error) {
	if have == nil {
		stored, err := r.applier().Apply(ctx, nil, want)
		if err != nil {
			return nil, err
		}
		return stored.(*mcsv1beta1.ServiceImport), nil
	}
	if have.Labels[LabelManagedBy] != managedByValue && !adoptable(have) {
		return nil, fmt.Errorf("ServiceImport %s exists and was not created by clustermap: delete it to let clustermap import the service", client.ObjectKeyFromObject(have))
	}
	stored, err := r.applier().Apply(ctx, have, want, r.takenOver(have)...)
	if err != nil {
		return nil, err
	}
	return stored.(*mcsv1beta1.ServiceImport), nil
}

// writeImportStatus applies the import's status (si: as stored). The
// status is clustermap's whole: what another writer put there by update
// (the AWS controller, on an import taken over) becomes clustermap's, so
// that what clustermap does not say goes.
func (r *Reconciler) writeImportStatus(ctx context.Context, si *mcsv1beta1.ServiceImport, status mcsv1beta1.ServiceImportStatus) error {
	want := &mcsv1beta1.ServiceImport{}
	want.Name, want.Namespace, want.Status = si.Name, si.Namespace, status
	return r.applier().ApplyStatus(ctx, si, want, kube.Updaters(si, "status")...)
}

// takenOver are the other writers of an import of the AWS controller's
// (its fields are clustermap's once it takes the import over).
func (r *Reconciler) takenOver(si *mcsv1beta1.ServiceImport) []string {
	if !adoptable(si) {
		return nil
	}
	return kube.Updaters(si, "")
}

// writeService applies the derived Service (want, owned by the import)
// and returns it as stored, its VIPs allocated.
func (r *Reconciler) writeService(ctx context.Context, owner *mcsv1beta1.ServiceImport, want *corev1.Service) (*corev1.Service, error) {
	if err := controllerutil.SetControllerReference(owner, want, r.Client.Scheme()); err != nil {
		return nil, err
	}
	have := &corev1.Service{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), have)
	if apierrors.IsNotFound(err) {
		return r.createService(ctx, want)
	}
	if err != nil {
		return nil, err
	}
	if have.Labels[LabelDerivedFor] != owner.Name {
		return nil, fmt.Errorf("Service %s exists and is not clustermap's derived Service for %s", client.ObjectKeyFromObject(have), owner.Name)
	}
	if recreates(have, want) {
		if err := r.Client.Delete(ctx, have); err != nil {
			return nil, err
		}
		return r.createService(ctx, want)
	}
	stored, err := r.applier().Apply(ctx, have, inPlace(have, want))
	if err != nil {
		return nil, err
	}
	return stored.(*corev1.Service), nil
}

// errFamilyNotSupported says no family of an import is one the cluster's
// Services can have.
var errFamilyNotSupported = errors.New("this cluster's Services can have none of the import's IP families")

// createService makes the derived Service; when the API server refuses
// its families (a single-stack cluster), it tries each family alone, then
// says none fits.
func (r *Reconciler) createService(ctx context.Context, want *corev1.Service) (*corev1.Service, error) {
	stored, err := r.applier().Apply(ctx, nil, want)
	if err == nil {
		return stored.(*corev1.Service), nil
	}
	if !apierrors.IsInvalid(err) || len(want.Spec.IPFamilies) == 0 {
		return nil, err
	}
	if len(want.Spec.IPFamilies) == 2 {
		// The API server takes no family it lacks, even a preferred
		// second one: each alone, the policy kept, which a dual-stack
		// cluster would have filled in.
		for _, f := range want.Spec.IPFamilies {
			one := want.DeepCopy()
			one.Spec.IPFamilies = []corev1.IPFamily{f}
			stored, err2 := r.applier().Apply(ctx, nil, one)
			if err2 == nil {
				return stored.(*corev1.Service), nil
			}
			if !apierrors.IsInvalid(err2) {
				return nil, err2
			}
		}
	}
	return nil, fmt.Errorf("%w (%v): %v", errFamilyNotSupported, want.Spec.IPFamilies, err)
}

// writeSlices makes the import's EndpointSlices the planned ones, in
// sliceOrder.
func (r *Reconciler) writeSlices(ctx context.Context, owner *mcsv1beta1.ServiceImport, key registry.Key, want []*discoveryv1.EndpointSlice) error {
	have := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, have, client.InNamespace(key.Namespace),
		client.MatchingLabels{mcsv1beta1.LabelServiceName: key.Name, discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return err
	}
	for _, s := range want {
		if err := controllerutil.SetControllerReference(owner, s, r.Client.Scheme()); err != nil {
			return err
		}
	}
	var errs []error
	for _, step := range sliceOrder(have.Items, want) {
		if step.drop != nil {
			errs = append(errs, client.IgnoreNotFound(r.Client.Delete(ctx, step.drop)))
			continue
		}
		var held client.Object
		if step.have != nil {
			held = step.have
		}
		_, err := r.applier().Apply(ctx, held, step.want)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// remove deletes the import and what it owns: the service is exported
// nowhere any more.
func (r *Reconciler) remove(ctx context.Context, key registry.Key) error {
	si := &mcsv1beta1.ServiceImport{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: key.Name}, si)
	if err == nil && si.Labels[LabelManagedBy] == managedByValue {
		if err := client.IgnoreNotFound(r.Client.Delete(ctx, si)); err != nil {
			return err
		}
	} else if client.IgnoreNotFound(err) != nil {
		return err
	}
	// Owned objects would go with the import; deleting them now makes the
	// removal immediate rather than wait for garbage collection.
	if err := r.Client.DeleteAllOf(ctx, &discoveryv1.EndpointSlice{}, client.InNamespace(key.Namespace),
		client.MatchingLabels{mcsv1beta1.LabelServiceName: key.Name, discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return err
	}
	return r.deleteDerived(ctx, key)
}

func (r *Reconciler) deleteDerived(ctx context.Context, key registry.Key) error {
	svc := &corev1.Service{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: DerivedName(key.Name)}, svc)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if svc.Labels[LabelDerivedFor] != key.Name {
		return nil
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, svc))
}

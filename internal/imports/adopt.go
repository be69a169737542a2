package imports

import (
	"context"
	"maps"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// What the AWS Cloud Map MCS controller puts on the imports it makes: a
// ServiceImport annotated with its derived Service ("imported-<hash>",
// owned by the import), whose EndpointSlices carry the import's name and
// its managed-by value. clustermap takes such an import over (the switch
// from that controller, docs/migrate-from-aws-controller.md) and removes
// the rest once its own derived Service and slices are in place.
const (
	AWSDerivedServiceAnnotation = "multicluster.k8s.aws/derived-service"
	AWSManagedBy                = "aws-cloud-map-mcs-controller-for-k8s"
)

// adoptable says whether a ServiceImport clustermap did not create is the
// AWS controller's, which clustermap takes over.
func adoptable(si *mcsv1beta1.ServiceImport) bool {
	_, ok := si.Annotations[AWSDerivedServiceAnnotation]
	return ok
}

// withAWSMark keeps the AWS controller's annotation on the import until
// its leftovers are gone: a failure halfway is finished on the next pass.
func withAWSMark(have *mcsv1beta1.ServiceImport, want map[string]string) map[string]string {
	v, ok := have.Annotations[AWSDerivedServiceAnnotation]
	if !ok {
		return want
	}
	out := maps.Clone(want)
	if out == nil {
		out = map[string]string{}
	}
	out[AWSDerivedServiceAnnotation] = v
	return out
}

// dropAWSLeftovers removes the AWS controller's EndpointSlices and derived
// Service (named derived) of an import clustermap took over, its own being
// in place by now; the caller drops the annotation that named them.
func (r *Reconciler) dropAWSLeftovers(ctx context.Context, si *mcsv1beta1.ServiceImport, derived string) error {
	if err := r.Client.DeleteAllOf(ctx, &discoveryv1.EndpointSlice{}, client.InNamespace(si.Namespace),
		client.MatchingLabels{mcsv1beta1.LabelServiceName: si.Name, discoveryv1.LabelManagedBy: AWSManagedBy}); err != nil {
		return err
	}
	svc := &corev1.Service{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: si.Namespace, Name: derived}, svc)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	case metav1.IsControlledBy(svc, si) && svc.Labels[LabelDerivedFor] == "" && derived != DerivedName(si.Name):
		// The AWS controller's, never clustermap's own derived Service.
		return client.IgnoreNotFound(r.Client.Delete(ctx, svc))
	}
	return nil
}

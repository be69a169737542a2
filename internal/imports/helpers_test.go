package imports

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
)

// importClient is a fake API server holding the namespace "ns".
func importClient() client.WithWatch {
	return fake.NewClientBuilder().WithScheme(kube.Scheme()).WithStatusSubresource(&mcsv1beta1.ServiceImport{}).
		WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).WithReturnManagedFields().Build()
}

// reconciled runs one pass of r over key and reads the ServiceImport back.
func reconciled(t *testing.T, r *Reconciler, key registry.Key) *mcsv1beta1.ServiceImport {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey(key)}); err != nil {
		t.Fatal(err)
	}
	si := &mcsv1beta1.ServiceImport{}
	if err := r.Client.Get(context.Background(), client.ObjectKey(key), si); err != nil {
		t.Fatal(err)
	}
	return si
}

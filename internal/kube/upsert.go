package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Upsert creates o, or replaces what the API server holds of it: what a
// command installs (grants, policies, CRDs). Two runs at once both end
// with o: a create that lost the race, or an update that met a newer
// version, is tried again.
func Upsert(ctx context.Context, c client.Client, o client.Object) error {
	return retry.OnError(retry.DefaultRetry, func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }, func() error {
		cur := o.DeepCopyObject().(client.Object)
		err := c.Get(ctx, client.ObjectKeyFromObject(o), cur)
		if apierrors.IsNotFound(err) {
			o.SetResourceVersion("")
			return c.Create(ctx, o)
		}
		if err != nil {
			return err
		}
		if _, ok := o.(*corev1.ServiceAccount); ok {
			return nil // nothing of it is ours to set but its name
		}
		o.SetResourceVersion(cur.GetResourceVersion())
		return c.Update(ctx, o)
	})
}

package kube

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InstallManager is the field manager of what clustermap's commands
// install.
const InstallManager = "clustermap-install"

// Upsert makes o what the API server holds of it, applied as
// InstallManager: what a command installs (grants, policies, CRDs). Two
// runs at once both end with o.
func Upsert(ctx context.Context, c client.Client, o client.Object) error {
	var have client.Object = o.DeepCopyObject().(client.Object)
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), have); apierrors.IsNotFound(err) {
		have = nil
	} else if err != nil {
		return err
	}
	_, err := Applier{Client: c, Manager: InstallManager}.Apply(ctx, have, o)
	return err
}

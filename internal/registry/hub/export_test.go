package hub

import (
	"context"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/registry"
)

// For the tests of package hub_test (which start clusters through devenv,
// which imports this package).
var (
	Chunks     = chunks
	ObjectName = objectName
)

func (r *Registry) Held(ctx context.Context, key registry.Key) (map[string]*hubv1alpha1.ClusterExport, error) {
	return r.held(ctx, key, true)
}

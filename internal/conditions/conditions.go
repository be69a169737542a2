// Package conditions writes a ServiceExport's conditions with server-side
// apply, each writer owning only its own conditions: the export reconciler
// Valid and Ready, the import reconciler Conflict. Neither can then undo the
// other's write, and neither write can fail on the other's resourceVersion
// (a conflict there would make the export side retry, and republish).
package conditions

import (
	"context"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// Field managers of the two writers.
const (
	ExportManager = "clustermap-export"
	ImportManager = "clustermap-import"
)

// Apply makes the export's conditions of the given types, as se holds
// them, the ones manager owns. A ServiceExport gone meanwhile is no error.
func Apply(ctx context.Context, c client.Client, se *mcsv1beta1.ServiceExport, manager string, types ...mcsv1beta1.ServiceExportConditionType) error {
	var conds []any
	for _, t := range types {
		for _, cond := range se.Status.Conditions {
			if cond.Type == string(t) {
				m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&cond)
				if err != nil {
					return err
				}
				conds = append(conds, m)
			}
		}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mcsv1beta1.GroupVersion.String(),
		"kind":       "ServiceExport",
		"metadata":   map[string]any{"name": se.Name, "namespace": se.Namespace},
		"status":     map[string]any{"conditions": conds},
	}}
	return client.IgnoreNotFound(c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(manager), client.ForceOwnership))
}

package mcs

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
)

func withConditions(si *mcsv1beta1.ServiceImport, cs ...metav1.Condition) *mcsv1beta1.ServiceImport {
	si.Status.Conditions = cs
	return si
}

func TestObjectsAreCounted(t *testing.T) {
	cond := func(typ mcsv1beta1.ServiceExportConditionType, s metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: string(typ), Status: s, Reason: "R"}
	}
	export := func(name string, cs ...metav1.Condition) *mcsv1beta1.ServiceExport {
		return &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name}, Status: mcsv1beta1.ServiceExportStatus{Conditions: cs}}
	}
	imp := func(name string, typ mcsv1beta1.ServiceImportType, clusters ...string) *mcsv1beta1.ServiceImport {
		si := &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: name}, Spec: mcsv1beta1.ServiceImportSpec{Type: typ}}
		for _, c := range clusters {
			si.Status.Clusters = append(si.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: c})
		}
		return si
	}
	c := fake.NewClientBuilder().WithScheme(kube.Scheme()).WithObjects(
		export("a", cond(mcsv1beta1.ServiceExportConditionValid, metav1.ConditionTrue), cond(mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue)),
		export("b", cond(mcsv1beta1.ServiceExportConditionValid, metav1.ConditionTrue), cond(mcsv1beta1.ServiceExportConditionReady, metav1.ConditionTrue),
			cond(mcsv1beta1.ServiceExportConditionConflict, metav1.ConditionTrue)),
		export("c", cond(mcsv1beta1.ServiceExportConditionValid, metav1.ConditionFalse)),
		imp("a", mcsv1beta1.ClusterSetIP, "c1", "c2"), imp("h", mcsv1beta1.Headless, "c2", "c3"),
		withConditions(imp("d", mcsv1beta1.ClusterSetIP, "c1"), metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse},
			metav1.Condition{Type: imports.ConditionClustersDrained, Status: metav1.ConditionTrue}, metav1.Condition{Type: "Other", Status: metav1.ConditionTrue}),
		withConditions(imp("e", mcsv1beta1.ClusterSetIP, "c1"), metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue},
			metav1.Condition{Type: imports.ConditionRemovalHeld, Status: metav1.ConditionTrue}, metav1.Condition{Type: imports.ConditionEndpointsCapped, Status: metav1.ConditionTrue}),
	).Build()
	want := `
# HELP clustermap_mcs_clusters Clusters whose exports this cluster imports.
# TYPE clustermap_mcs_clusters gauge
clustermap_mcs_clusters 3
# HELP clustermap_mcs_export_conflicts ServiceExports whose Conflict condition is True (the clusterset's exports of the service disagree).
# TYPE clustermap_mcs_export_conflicts gauge
clustermap_mcs_export_conflicts 1
# HELP clustermap_mcs_exports ServiceExports in this cluster, by their Valid and Ready conditions (true, false, unknown).
# TYPE clustermap_mcs_exports gauge
clustermap_mcs_exports{ready="true",valid="true"} 2
clustermap_mcs_exports{ready="unknown",valid="false"} 1
# HELP clustermap_mcs_import_conditions ServiceImports in this cluster with each condition an operator acts on (Ready, ClustersDrained, RemovalHeld, EndpointsCapped), by its status (true, false).
# TYPE clustermap_mcs_import_conditions gauge
clustermap_mcs_import_conditions{condition="ClustersDrained",status="false"} 0
clustermap_mcs_import_conditions{condition="ClustersDrained",status="true"} 1
clustermap_mcs_import_conditions{condition="EndpointsCapped",status="false"} 0
clustermap_mcs_import_conditions{condition="EndpointsCapped",status="true"} 1
clustermap_mcs_import_conditions{condition="Ready",status="false"} 1
clustermap_mcs_import_conditions{condition="Ready",status="true"} 1
clustermap_mcs_import_conditions{condition="RemovalHeld",status="false"} 0
clustermap_mcs_import_conditions{condition="RemovalHeld",status="true"} 1
# HELP clustermap_mcs_imports ServiceImports in this cluster, by type.
# TYPE clustermap_mcs_imports gauge
clustermap_mcs_imports{type="ClusterSetIP"} 3
clustermap_mcs_imports{type="Headless"} 1
`
	if err := testutil.CollectAndCompare(objects{c}, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

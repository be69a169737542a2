package mcs

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/imports"
)

// objects reports this cluster's exports, imports and conflicts as the
// manager's cache holds them at scrape time: counted, never stored.
type objects struct{ c client.Reader }

var (
	exportsDesc = prometheus.NewDesc("clustermap_mcs_exports",
		"ServiceExports in this cluster, by their Valid and Ready conditions (true, false, unknown).", []string{"valid", "ready"}, nil)
	conflictsDesc = prometheus.NewDesc("clustermap_mcs_export_conflicts",
		"ServiceExports whose Conflict condition is True (the clusterset's exports of the service disagree).", nil, nil)
	importsDesc = prometheus.NewDesc("clustermap_mcs_imports",
		"ServiceImports in this cluster, by type.", []string{"type"}, nil)
	clustersDesc = prometheus.NewDesc("clustermap_mcs_clusters",
		"Clusters whose exports this cluster imports.", nil, nil)
	importConditionsDesc = prometheus.NewDesc("clustermap_mcs_import_conditions",
		"ServiceImports in this cluster with each condition an operator acts on (Ready, ClustersDrained, RemovalHeld, EndpointsCapped), by its status (true, false).",
		[]string{"condition", "status"}, nil)
)

// alerted are the ServiceImport conditions counted for alerts.
var alerted = []string{string(mcsv1beta1.ServiceImportConditionReady), imports.ConditionClustersDrained, imports.ConditionRemovalHeld, imports.ConditionEndpointsCapped}

func (objects) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{exportsDesc, conflictsDesc, importsDesc, clustersDesc, importConditionsDesc} {
		ch <- d
	}
}

func (o objects) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	exports := &mcsv1beta1.ServiceExportList{}
	if err := o.c.List(ctx, exports); err == nil {
		byState := map[[2]string]int{}
		conflicts := 0
		for _, se := range exports.Items {
			cs := se.Status.Conditions
			byState[[2]string{state(cs, mcsv1beta1.ServiceExportConditionValid), state(cs, mcsv1beta1.ServiceExportConditionReady)}]++
			if meta.IsStatusConditionTrue(cs, string(mcsv1beta1.ServiceExportConditionConflict)) {
				conflicts++
			}
		}
		for s, n := range byState {
			ch <- prometheus.MustNewConstMetric(exportsDesc, prometheus.GaugeValue, float64(n), s[0], s[1])
		}
		ch <- prometheus.MustNewConstMetric(conflictsDesc, prometheus.GaugeValue, float64(conflicts))
	}
	imports := &mcsv1beta1.ServiceImportList{}
	if err := o.c.List(ctx, imports); err == nil {
		byType := map[string]int{string(mcsv1beta1.ClusterSetIP): 0, string(mcsv1beta1.Headless): 0}
		clusters := map[string]bool{}
		conds := map[[2]string]int{}
		for _, c := range alerted {
			conds[[2]string{c, "true"}], conds[[2]string{c, "false"}] = 0, 0
		}
		for _, si := range imports.Items {
			byType[string(si.Spec.Type)]++
			for _, c := range si.Status.Clusters {
				clusters[c.Cluster] = true
			}
			for _, c := range si.Status.Conditions {
				if k := [2]string{c.Type, strings.ToLower(string(c.Status))}; slices.Contains(alerted, c.Type) && c.Status != metav1.ConditionUnknown {
					conds[k]++
				}
			}
		}
		for k, n := range conds {
			ch <- prometheus.MustNewConstMetric(importConditionsDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
		}
		for t, n := range byType {
			ch <- prometheus.MustNewConstMetric(importsDesc, prometheus.GaugeValue, float64(n), t)
		}
		ch <- prometheus.MustNewConstMetric(clustersDesc, prometheus.GaugeValue, float64(len(clusters)))
	}
}

func state(cs []metav1.Condition, t mcsv1beta1.ServiceExportConditionType) string {
	c := meta.FindStatusCondition(cs, string(t))
	switch {
	case c == nil, c.Status == metav1.ConditionUnknown:
		return "unknown"
	case c.Status == metav1.ConditionTrue:
		return "true"
	}
	return "false"
}

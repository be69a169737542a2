// Package merge resolves the exports of one service from every cluster into
// one import, as KEP-1645 says: each property from the oldest export, ports
// unioned, and every export of a property the clusters disagree on marked
// with that conflict.
package merge

import (
	"maps"
	"reflect"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// Result is the merged import of one service.
type Result struct {
	Spec                mcsv1beta1.ServiceImportSpec // without IPs: those are local
	Labels, Annotations map[string]string
	// Exports are the inputs, oldest first.
	Exports []registry.Export
	// Conflicts lists, for every exporting cluster, the properties the
	// clusters disagree on (upstream reason names); empty means none.
	Conflicts []mcsv1beta1.ServiceExportConditionReason
}

// Clusters lists the exporting clusters in name order.
func (r Result) Clusters() []string {
	out := make([]string, len(r.Exports))
	for i, e := range r.Exports {
		out[i] = e.Cluster
	}
	sort.Strings(out)
	return out
}

// ConflictReason is the Conflict condition's reason: the conflicts joined
// by commas, as the API allows, or NoConflicts.
func (r Result) ConflictReason() string {
	if len(r.Conflicts) == 0 {
		return string(mcsv1beta1.ServiceExportReasonNoConflicts)
	}
	s := make([]string, len(r.Conflicts))
	for i, c := range r.Conflicts {
		s[i] = string(c)
	}
	return strings.Join(s, ",")
}

// older orders exports by creation, then cluster id: the oldest wins.
func older(a, b registry.Export) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Cluster < b.Cluster
}

// Merge resolves exports (of one service, from distinct clusters).
func Merge(exports []registry.Export) Result {
	ex := append([]registry.Export(nil), exports...)
	sort.Slice(ex, func(i, j int) bool { return older(ex[i], ex[j]) })
	r := Result{Exports: ex}
	if len(ex) == 0 {
		return r
	}
	conflicts := map[mcsv1beta1.ServiceExportConditionReason]bool{}
	// An export whose records say no type (all of them invalid) has no
	// opinion on it; with none at all, the import is ClusterSetIP.
	r.Spec.Type = mcsv1beta1.ClusterSetIP
	typed := false
	for _, e := range ex {
		switch {
		case e.Type == "":
		case !typed:
			r.Spec.Type, typed = e.Type, true
		case e.Type != r.Spec.Type:
			conflicts[mcsv1beta1.ServiceExportReasonTypeConflict] = true
		}
	}

	// Ports are unioned; any difference between the exports' port sets is
	// a conflict, also a port one cluster has and another lacks.
	var ports []mcsv1beta1.ServicePort
	for _, e := range ex {
		for _, p := range e.Ports {
			if i := samePort(ports, p); i < 0 {
				ports = append(ports, p)
			} else if !reflect.DeepEqual(ports[i], p) {
				conflicts[mcsv1beta1.ServiceExportReasonPortConflict] = true
			}
		}
	}
	for _, e := range ex {
		if e.Foreign && len(e.Ports) == 0 {
			continue // the AWS controller's export without endpoints says nothing of its ports
		}
		if len(e.Ports) != len(ports) {
			conflicts[mcsv1beta1.ServiceExportReasonPortConflict] = true
		}
	}
	sort.Slice(ports, func(i, j int) bool {
		if ports[i].Port != ports[j].Port {
			return ports[i].Port < ports[j].Port
		}
		return ports[i].Protocol < ports[j].Protocol
	})
	r.Spec.Ports = ports

	// Service-level properties: exports written without them (by the AWS
	// controller) have no opinion.
	own := ex[:0:0]
	for _, e := range ex {
		if !e.Foreign {
			own = append(own, e)
		}
	}
	if len(own) > 0 {
		w := own[0]
		r.Spec.SessionAffinity = w.SessionAffinity
		r.Spec.SessionAffinityConfig = w.SessionAffinityConfig
		r.Spec.IPFamilies = w.IPFamilies
		r.Spec.InternalTrafficPolicy = w.InternalTrafficPolicy
		r.Spec.TrafficDistribution = w.TrafficDistribution
		for _, e := range own[1:] {
			check := func(reason mcsv1beta1.ServiceExportConditionReason, a, b any) {
				if !reflect.DeepEqual(a, b) {
					conflicts[reason] = true
				}
			}
			check(mcsv1beta1.ServiceExportReasonSessionAffinityConflict, affinity(e.SessionAffinity), affinity(w.SessionAffinity))
			check(mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict, e.SessionAffinityConfig, w.SessionAffinityConfig)
			check(mcsv1beta1.ServiceExportReasonIPFamilyConflict, e.IPFamilies, w.IPFamilies)
			check(mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict, e.InternalTrafficPolicy, w.InternalTrafficPolicy)
			check(mcsv1beta1.ServiceExportReasonTrafficDistributionConflict, e.TrafficDistribution, w.TrafficDistribution)
		}
		// Exported labels and annotations are taken whole from the oldest
		// export, never unioned.
		r.Labels, r.Annotations = maps.Clone(w.Labels), maps.Clone(w.Annotations)
		for _, e := range own[1:] {
			if !maps.Equal(e.Labels, w.Labels) {
				conflicts[mcsv1beta1.ServiceExportReasonLabelsConflict] = true
			}
			if !maps.Equal(e.Annotations, w.Annotations) {
				conflicts[mcsv1beta1.ServiceExportReasonAnnotationsConflict] = true
			}
		}
	}
	if r.Spec.SessionAffinity == "" {
		r.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	for _, reason := range reasonOrder {
		if conflicts[reason] {
			r.Conflicts = append(r.Conflicts, reason)
		}
	}
	return r
}

var reasonOrder = []mcsv1beta1.ServiceExportConditionReason{
	mcsv1beta1.ServiceExportReasonTypeConflict, mcsv1beta1.ServiceExportReasonPortConflict,
	mcsv1beta1.ServiceExportReasonSessionAffinityConflict, mcsv1beta1.ServiceExportReasonSessionAffinityConfigConflict,
	mcsv1beta1.ServiceExportReasonIPFamilyConflict, mcsv1beta1.ServiceExportReasonInternalTrafficPolicyConflict,
	mcsv1beta1.ServiceExportReasonTrafficDistributionConflict, mcsv1beta1.ServiceExportReasonLabelsConflict,
	mcsv1beta1.ServiceExportReasonAnnotationsConflict,
}

func affinity(a corev1.ServiceAffinity) corev1.ServiceAffinity {
	if a == "" {
		return corev1.ServiceAffinityNone
	}
	return a
}

// samePort finds the port p collides with: the same name, or the same
// number and protocol.
func samePort(ports []mcsv1beta1.ServicePort, p mcsv1beta1.ServicePort) int {
	for i, q := range ports {
		if (p.Name != "" && p.Name == q.Name) || (p.Port == q.Port && p.Protocol == q.Protocol) {
			return i
		}
	}
	return -1
}

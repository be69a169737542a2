package merge

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

var t0 = time.Unix(1700000000, 0)

func export(cluster string, age int, mutate func(*registry.Export)) registry.Export {
	e := registry.Export{
		Cluster: cluster, Created: t0.Add(-time.Duration(age) * time.Minute), Type: mcsv1beta1.ClusterSetIP,
		Ports:      []mcsv1beta1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
	}
	if mutate != nil {
		mutate(&e)
	}
	return e
}

func TestMerge(t *testing.T) {
	cases := []struct {
		name      string
		exports   []registry.Export
		wantType  mcsv1beta1.ServiceImportType
		wantPorts []int32
		conflicts string
		check     func(*testing.T, Result)
	}{
		{name: "agreeing exports", exports: []registry.Export{export("c1", 1, nil), export("c2", 2, nil)},
			wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{80}, conflicts: "NoConflicts",
			check: func(t *testing.T, r Result) {
				if !reflect.DeepEqual(r.Clusters(), []string{"c1", "c2"}) || r.Exports[0].Cluster != "c2" {
					t.Errorf("clusters %v, oldest first %s", r.Clusters(), r.Exports[0].Cluster)
				}
			}},
		{name: "ports are unioned, and differing port sets are a conflict", exports: []registry.Export{export("c1", 1, nil), export("c2", 2, func(e *registry.Export) {
			e.Ports = append(e.Ports, mcsv1beta1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
		})}, wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{53, 80}, conflicts: "PortConflict"},
		{name: "the same ports in another order agree", exports: []registry.Export{
			export("c1", 1, func(e *registry.Export) {
				e.Ports = []mcsv1beta1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}, e.Ports[0]}
			}),
			export("c2", 2, func(e *registry.Export) {
				e.Ports = append(e.Ports, mcsv1beta1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53})
			})}, wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{53, 80}, conflicts: "NoConflicts"},
		{name: "a port defined differently goes to the oldest", exports: []registry.Export{
			export("young", 1, func(e *registry.Export) { e.Ports[0].Port = 8080 }), export("old", 5, nil)},
			wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{80}, conflicts: "PortConflict"},
		{name: "type conflict: the oldest wins", exports: []registry.Export{
			export("young", 1, nil), export("old", 5, func(e *registry.Export) { e.Type = mcsv1beta1.Headless })},
			wantType: mcsv1beta1.Headless, wantPorts: []int32{80}, conflicts: "TypeConflict"},
		{name: "an export without a type (its records all invalid) has no say on it", exports: []registry.Export{
			export("young", 1, func(e *registry.Export) { e.Type = mcsv1beta1.Headless }),
			export("broken", 9, func(e *registry.Export) { e.Type = ""; e.Foreign = true; e.Ports = nil })},
			wantType: mcsv1beta1.Headless, wantPorts: []int32{80}, conflicts: "NoConflicts"},
		{name: "ties go to the lower cluster id", exports: []registry.Export{
			export("b", 3, func(e *registry.Export) { e.Type = mcsv1beta1.Headless }), export("a", 3, nil)},
			wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{80}, conflicts: "TypeConflict"},
		{name: "service properties", exports: []registry.Export{
			export("young", 1, func(e *registry.Export) {
				e.SessionAffinity = corev1.ServiceAffinityClientIP
				e.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
				e.Labels = map[string]string{"team": "b", "extra": "1"}
			}),
			export("old", 5, func(e *registry.Export) { e.Labels = map[string]string{"team": "a"} })},
			wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{80},
			conflicts: "SessionAffinityConflict,InternalTrafficPolicyConflict,LabelsConflict",
			check: func(t *testing.T, r Result) {
				if r.Spec.SessionAffinity != corev1.ServiceAffinityNone || r.Spec.InternalTrafficPolicy != nil {
					t.Errorf("the oldest export's properties should win: %+v", r.Spec)
				}
				if !reflect.DeepEqual(r.Labels, map[string]string{"team": "a"}) {
					t.Errorf("labels are the oldest export's, not a union: %v", r.Labels)
				}
			}},
		{name: "exported annotations: the oldest's set, a key only one export has is a conflict", exports: []registry.Export{
			export("young", 1, func(e *registry.Export) { e.Annotations = map[string]string{"a": "1", "b": "2"} }),
			export("old", 5, func(e *registry.Export) { e.Annotations = map[string]string{"a": "1"} })},
			wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{80}, conflicts: "AnnotationsConflict",
			check: func(t *testing.T, r Result) {
				if !reflect.DeepEqual(r.Annotations, map[string]string{"a": "1"}) || r.Labels != nil {
					t.Errorf("annotations %v labels %v", r.Annotations, r.Labels)
				}
			}},
		{name: "an export of the AWS controller has no opinion on service properties", exports: []registry.Export{
			export("aws", 9, func(e *registry.Export) { e.Foreign = true; e.IPFamilies = nil }),
			export("c1", 1, func(e *registry.Export) { e.SessionAffinity = corev1.ServiceAffinityClientIP })},
			wantType: mcsv1beta1.ClusterSetIP, wantPorts: []int32{80}, conflicts: "NoConflicts",
			check: func(t *testing.T, r Result) {
				if r.Spec.SessionAffinity != corev1.ServiceAffinityClientIP || len(r.Spec.IPFamilies) != 1 {
					t.Errorf("service properties from clustermap's export: %+v", r.Spec)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := Merge(tc.exports)
			if r.Spec.Type != tc.wantType {
				t.Errorf("type %s, want %s", r.Spec.Type, tc.wantType)
			}
			var ports []int32
			for _, p := range r.Spec.Ports {
				ports = append(ports, p.Port)
			}
			if !reflect.DeepEqual(ports, tc.wantPorts) {
				t.Errorf("ports %v, want %v", ports, tc.wantPorts)
			}
			if got := r.ConflictReason(); got != tc.conflicts {
				t.Errorf("conflicts %s, want %s", got, tc.conflicts)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

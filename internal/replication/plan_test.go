package replication

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func service(sel map[string]string, ann map[string]string, lbl map[string]string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "api", Annotations: ann, Labels: lbl, ResourceVersion: "1"},
		Spec: corev1.ServiceSpec{Selector: sel, Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("web")}}}}
}

func pod(name, ip string, ready bool) corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: name, Labels: map[string]string{"app": "api"}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080}}}}},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
}

func slice(name, manager, from string, ips ...string) discoveryv1.EndpointSlice {
	s := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: name, Labels: map[string]string{
		discoveryv1.LabelServiceName: "api", discoveryv1.LabelManagedBy: manager, LabelSourceCluster: from}}}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

func peer(p Plan, name string) Changes {
	for _, c := range p.Peers {
		if c.Cluster == name {
			return c
		}
	}
	return Changes{}
}

var app = map[string]string{"app": "api"}

func TestSourceReplicates(t *testing.T) {
	local := Cluster{Name: "a", Service: service(app, nil, nil), Pods: []corev1.Pod{pod("p1", "10.0.0.1", true), pod("p2", "10.0.0.2", false)}}
	p := Compute("web", "api", local, []Cluster{{Name: "b"}, {Name: "c", Service: service(app, nil, nil)}})
	b := peer(p, "b")
	if b.Service == nil || b.Service.Labels[LabelSourceCluster] != "a" || len(b.Service.Spec.Selector) != 0 {
		t.Fatalf("replica for b: %+v", b.Service)
	}
	if len(b.Upsert) != 1 || len(b.Upsert[0].Endpoints) != 1 || b.Upsert[0].Endpoints[0].Addresses[0] != "10.0.0.1" || *b.Upsert[0].Ports[0].Port != 8080 {
		t.Fatalf("slice for b: %+v", b.Upsert)
	}
	if c := peer(p, "c"); !c.Empty() {
		t.Errorf("c's own Service was written: %+v", c)
	}
	if len(p.Events) != 2 || p.Events[1].Reason != "NameClash" {
		t.Errorf("events %+v, want Replicated and NameClash", p.Events)
	}
	if !p.Local.Empty() {
		t.Errorf("local changes for a plain source: %+v", p.Local)
	}
}

func TestReceiverHandsOver(t *testing.T) {
	L := service(app, map[string]string{AnnotationMode: "receiver"}, nil)
	kube := slice("api-x", kubeSliceManager, "", "10.0.0.1")
	local := Cluster{Name: "a", Service: L, Pods: []corev1.Pod{pod("p1", "10.0.0.1", true)}, Slices: []discoveryv1.EndpointSlice{kube}}
	replica := service(nil, nil, map[string]string{LabelSourceCluster: "a"})
	p := Compute("web", "api", local, []Cluster{{Name: "b", Service: replica}})
	if p.Local.Service == nil || len(p.Local.Service.Spec.Selector) != 0 || p.Local.Service.Annotations[AnnotationSelector] == "" {
		t.Fatalf("selector not handed over: %+v", p.Local.Service)
	}
	if len(p.Local.Upsert) != 1 || len(p.Local.Delete) != 1 || p.Local.Delete[0] != "api-x" {
		t.Fatalf("local: upsert %d, delete %v; want our slice written and the controller's retired", len(p.Local.Upsert), p.Local.Delete)
	}
	b := peer(p, "b")
	if b.Service == nil || ModeOf(b.Service) != ModeSource || b.Service.Labels[LabelSourceCluster] != "" {
		t.Fatalf("target not made the source: %+v", b.Service)
	}
	// Bridge: once b serves in a, a stops and retires its slices.
	handed := p.Local.Service
	ours := slice(SliceName("api", "a"), ManagedBy, "a", "10.0.0.1")
	fromB := slice(SliceName("api", "b"), ManagedBy, "b", "10.1.0.1")
	target := service(map[string]string{"app": "new"}, map[string]string{AnnotationMode: "source"}, nil)
	p = Compute("web", "api", Cluster{Name: "a", Service: handed, Pods: local.Pods, Slices: []discoveryv1.EndpointSlice{ours, fromB}},
		[]Cluster{{Name: "b", Service: target, Slices: []discoveryv1.EndpointSlice{ours, slice("api-y", kubeSliceManager, "", "10.1.0.1")}}})
	if len(p.Local.Delete) != 1 || len(peer(p, "b").Delete) != 1 {
		t.Errorf("bridge not ended: local %+v, b %+v", p.Local, peer(p, "b"))
	}
	// Without b serving, nothing is retired.
	p = Compute("web", "api", Cluster{Name: "a", Service: handed, Pods: local.Pods, Slices: []discoveryv1.EndpointSlice{ours}},
		[]Cluster{{Name: "b", Service: target, Slices: []discoveryv1.EndpointSlice{ours}}})
	if len(p.Local.Delete) != 0 || len(peer(p, "b").Delete) != 0 {
		t.Errorf("a slice retired with nothing else serving: local %+v, b %+v", p.Local, peer(p, "b"))
	}
}

func TestSingularAndInvalid(t *testing.T) {
	ours := service(nil, nil, map[string]string{LabelSourceCluster: "a"})
	ours.UID = "u1"
	p := Compute("web", "api", Cluster{Name: "a", Service: service(app, map[string]string{AnnotationModeAlias: "singular"}, nil)}, []Cluster{{Name: "b", Service: ours}})
	if b := peer(p, "b"); !b.DeleteService || b.DeleteUID != "u1" {
		t.Errorf("singular source keeps its replica: %+v", b)
	}
	marked := ours.DeepCopy()
	marked.Annotations = map[string]string{AnnotationMode: "singular"}
	p = Compute("web", "api", Cluster{Name: "a", Service: service(app, nil, nil)}, []Cluster{{Name: "b", Service: marked}})
	if p.Local.Service == nil || ModeOf(p.Local.Service) != ModeSingular || !peer(p, "b").DeleteService {
		t.Errorf("singular on the replica not taken: %+v", p)
	}
	p = Compute("web", "api", Cluster{Name: "a", Service: service(app, map[string]string{AnnotationMode: "sideways"}, nil)}, []Cluster{{Name: "b"}})
	if len(p.Peers) != 0 || len(p.Events) != 1 || p.Events[0].Reason != "InvalidMode" {
		t.Errorf("invalid mode: %+v", p)
	}
	// A deleted source removes its replicas; a peer left out (down) gets nothing.
	p = Compute("web", "api", Cluster{Name: "a"}, []Cluster{{Name: "b", Service: ours}})
	if !peer(p, "b").DeleteService {
		t.Errorf("deleted source keeps its replica: %+v", p)
	}
}

func dualPod(name string, ips ...string) corev1.Pod {
	p := pod(name, ips[0], true)
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

// One slice per address family, from status.podIPs; a family whose pods
// are gone retires once another slice serves.
func TestDualStackSlices(t *testing.T) {
	byFamily := func(c Changes) map[discoveryv1.AddressType][]string {
		out := map[discoveryv1.AddressType][]string{}
		for _, s := range c.Upsert {
			out[s.AddressType] = []string{}
			for _, e := range s.Endpoints {
				out[s.AddressType] = append(out[s.AddressType], e.Addresses[0])
			}
		}
		return out
	}
	dual := service(app, nil, nil)
	dual.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	dual.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	local := Cluster{Name: "a", Service: dual, Pods: []corev1.Pod{dualPod("p1", "10.0.0.1", "fd00::1"), dualPod("p2", "fd00::2", "10.0.0.2")}}
	b := peer(Compute("web", "api", local, []Cluster{{Name: "b"}}), "b")
	got := byFamily(b)
	if len(got) != 2 || len(got[discoveryv1.AddressTypeIPv4]) != 2 || len(got[discoveryv1.AddressTypeIPv6]) != 2 || got[discoveryv1.AddressTypeIPv6][0] != "fd00::1" {
		t.Errorf("dual-stack pods: slices %v", got)
	}
	if b.Service.Spec.IPFamilyPolicy == nil || *b.Service.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyPreferDualStack {
		t.Errorf("a dual-stack Service's replica should prefer dual-stack: %v", b.Service.Spec.IPFamilyPolicy)
	}

	single := service(app, nil, nil)
	single.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	if got := byFamily(peer(Compute("web", "api", Cluster{Name: "a", Service: single, Pods: local.Pods}, []Cluster{{Name: "b"}}), "b")); len(got) != 1 || len(got[discoveryv1.AddressTypeIPv4]) != 2 {
		t.Errorf("a single-stack IPv4 Service of dual-stack pods: slices %v, want IPv4 only", got)
	}
	v6 := Cluster{Name: "a", Service: service(app, nil, nil), Pods: []corev1.Pod{dualPod("p1", "fd00::1")}}
	if got := byFamily(peer(Compute("web", "api", v6, []Cluster{{Name: "b"}}), "b")); len(got) != 1 || len(got[discoveryv1.AddressTypeIPv6]) != 1 {
		t.Errorf("IPv6-only pods: slices %v", got)
	}

	// Pods now IPv4 only: the IPv6 slice retires, the IPv4 one serves.
	names := sliceNames("api", "a")
	existing := []discoveryv1.EndpointSlice{slice(names[discoveryv1.AddressTypeIPv4], ManagedBy, "a", "10.0.0.1"), slice(names[discoveryv1.AddressTypeIPv6], ManagedBy, "a", "fd00::1")}
	existing[1].AddressType = discoveryv1.AddressTypeIPv6
	existing[0].AddressType = discoveryv1.AddressTypeIPv4
	replica := service(nil, nil, map[string]string{LabelSourceCluster: "a"})
	v4 := Cluster{Name: "a", Service: service(app, nil, nil), Pods: []corev1.Pod{pod("p1", "10.0.0.1", true)}}
	c := peer(Compute("web", "api", v4, []Cluster{{Name: "b", Service: replica, Slices: existing}}), "b")
	if len(c.Delete) != 1 || c.Delete[0] != names[discoveryv1.AddressTypeIPv6] {
		t.Errorf("the IPv6 slice should retire: delete %v, upsert %v", c.Delete, byFamily(c))
	}
}

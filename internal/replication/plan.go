// Package replication replicates Services and their ready endpoints straight
// between peer clusters, with the migration modes of k8s-endpoints-sync-
// controller (source, receiver, union, singular).
//
// Every cluster's controller pushes its own contribution: the ready pods of
// a Service, as an EndpointSlice of its own in every cluster that serves the
// name (peers, and itself when clustermap removed the local selector), and
// a selector-less replica Service in peers that lack one. A slice no longer
// wanted stays until its cluster has other ready endpoints for the name, so
// that no migration step leaves a cluster without any.
package replication

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/clustermap/clustermap/internal/kube"
)

const (
	// AnnotationMode is the original's key; AnnotationModeAlias is accepted too.
	AnnotationMode      = "vmware.com/syndicate-mode"
	AnnotationModeAlias = "syndicate.clustermap.io/mode"
	// AnnotationSelector keeps a selector clustermap removed (receiver, union).
	AnnotationSelector = "syndicate.clustermap.io/selector"
	// AnnotationUnionSelector, on replicas of a union Service: every cluster
	// serves its own pods matching it.
	AnnotationUnionSelector = "syndicate.clustermap.io/union-selector"
	// LabelSourceCluster marks replicas and slices with the cluster they come
	// from; a replica is never replicated onward.
	LabelSourceCluster = "syndicate.clustermap.io/source-cluster"
	// ManagedBy is the EndpointSlice managed-by of clustermap's slices.
	ManagedBy = "syndicate.clustermap.io"
	// Once a selector is removed, the EndpointSlice controller's slices and
	// the slices mirrored from the orphaned Endpoints object would keep the
	// old pods forever; clustermap retires them like its own.
	kubeSliceManager     = "endpointslice-controller.k8s.io"
	mirroredSliceManager = "endpointslicemirroring-controller.k8s.io"
)

// Mode is a Service's migration mode.
type Mode string

const (
	ModeDefault  Mode = ""
	ModeSource   Mode = "source"
	ModeReceiver Mode = "receiver"
	ModeUnion    Mode = "union"
	ModeSingular Mode = "singular"
)

// ModeOf reads a Service's mode; an unknown value is reported by Valid.
func ModeOf(svc *corev1.Service) Mode {
	if svc == nil {
		return ModeDefault
	}
	if m, ok := svc.Annotations[AnnotationMode]; ok {
		return Mode(m)
	}
	return Mode(svc.Annotations[AnnotationModeAlias])
}

// ValidMode says whether a mode is one clustermap knows.
func ValidMode(m Mode) bool {
	return m == ModeDefault || m == ModeSource || m == ModeReceiver || m == ModeUnion || m == ModeSingular
}

func setMode(svc *corev1.Service, m Mode) {
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	svc.Annotations[AnnotationMode] = string(m)
	if _, ok := svc.Annotations[AnnotationModeAlias]; ok {
		svc.Annotations[AnnotationModeAlias] = string(m)
	}
}

// Cluster is what one cluster holds for a Service name.
type Cluster struct {
	Name    string
	Service *corev1.Service // nil when absent
	Pods    []corev1.Pod    // the namespace's pods (local cluster only)
	Slices  []discoveryv1.EndpointSlice
}

// Changes are the writes to one cluster, applied in order: slices upserted,
// Service written, then slices and Service deleted.
type Changes struct {
	Cluster         string
	Namespace, Name string
	Upsert          []*discoveryv1.EndpointSlice
	Service         *corev1.Service // created (no resourceVersion) or updated
	DeleteService   bool
	DeleteUID       types.UID // the replica read, deleted only if still the same
	Delete          []string  // slice names
	// DeleteEndpoints removes the Endpoints object left from a selector.
	DeleteEndpoints bool
}

func (c Changes) Empty() bool {
	return len(c.Upsert) == 0 && c.Service == nil && !c.DeleteService && len(c.Delete) == 0 && !c.DeleteEndpoints
}

// Event is said on the local Service.
type Event struct{ Type, Reason, Message string }

// Plan is every write for one Service name.
type Plan struct {
	Local  Changes
	Peers  []Changes
	Events []Event
}

// Compute plans one Service name from the local cluster and its reachable
// peers (an unreachable peer is left out, so nothing is planned for it).
func Compute(ns, name string, local Cluster, peers []Cluster) Plan {
	p := Plan{Local: Changes{Cluster: local.Name, Namespace: ns, Name: name}}
	L := local.Service
	mode := ModeOf(L)
	if L != nil && !ValidMode(mode) {
		p.Events = append(p.Events, Event{corev1.EventTypeWarning, "InvalidMode", fmt.Sprintf(
			"%s=%q is not one of source, receiver, union, singular; replication of this Service is unchanged", AnnotationMode, mode)})
		return p
	}
	isReplica := L != nil && L.Labels[LabelSourceCluster] != ""
	// A Service that has a selector of its own owns replicas in peers.
	owner := L != nil && !isReplica && L.DeletionTimestamp == nil && (mode == ModeDefault || mode == ModeSource || mode == ModeUnion)
	owner = owner && (len(L.Spec.Selector) > 0 || L.Annotations[AnnotationSelector] != "")

	newL := L.DeepCopy()
	localChanged := false
	peerSvc := map[string]*corev1.Service{}

	// Singular set on a replica of ours stops replication from here.
	if owner {
		for _, peer := range peers {
			if isOurReplica(peer.Service, local.Name) && ModeOf(peer.Service) == ModeSingular {
				setMode(newL, ModeSingular)
				localChanged, owner, mode = true, false, ModeSingular
				p.Events = append(p.Events, Event{corev1.EventTypeNormal, "ModeChanged", "singular set on the replica in " + peer.Name + ": replication stopped, replicas removed"})
				break
			}
		}
	}
	// Receiver and union hand the selector over to clustermap, which keeps
	// serving its pods through a slice written before the selector goes.
	if L != nil && (mode == ModeReceiver || mode == ModeUnion) && len(L.Spec.Selector) > 0 {
		sel, _ := json.Marshal(L.Spec.Selector)
		metav1.SetMetaDataAnnotation(&newL.ObjectMeta, AnnotationSelector, string(sel))
		newL.Spec.Selector = nil
		localChanged = true
		p.Events = append(p.Events, Event{corev1.EventTypeNormal, "ModeChanged", fmt.Sprintf("%s: selector removed, its pods are served through clustermap's EndpointSlices", mode)})
	}
	// Receiver: our replicas become sources (the stateful hand-over).
	if mode == ModeReceiver {
		for _, peer := range peers {
			if isOurReplica(peer.Service, local.Name) {
				s := peer.Service.DeepCopy()
				delete(s.Labels, LabelSourceCluster)
				setMode(s, ModeSource)
				peerSvc[peer.Name] = s
				p.Events = append(p.Events, Event{corev1.EventTypeNormal, "ModeChanged", "receiver: the Service in " + peer.Name + " is now the source"})
			}
		}
	}
	// Source set on a replica: it becomes a source, its origin a receiver.
	if isReplica && mode == ModeSource {
		from := L.Labels[LabelSourceCluster]
		delete(newL.Labels, LabelSourceCluster)
		localChanged = true
		for _, peer := range peers {
			if peer.Name == from && peer.Service != nil && ModeOf(peer.Service) != ModeReceiver {
				s := peer.Service.DeepCopy()
				setMode(s, ModeReceiver)
				peerSvc[peer.Name] = s
			}
		}
		p.Events = append(p.Events, Event{corev1.EventTypeNormal, "ModeChanged", "source: this Service is now the source, the one in " + from + " the receiver"})
	}
	if localChanged {
		p.Local.Service = newL
	}

	// What this cluster contributes: its ready pods matching a selector.
	sel, contributes := contributionSelector(newL, mode)
	if contributes && mode == ModeReceiver && othersReady(local.Slices, local.Name) {
		contributes = false // the new side serves: the bridge ends
	}
	var eps map[discoveryv1.AddressType][]discoveryv1.Endpoint
	var ports []discoveryv1.EndpointPort
	if contributes {
		eps, ports = endpointsOf(L, local.Pods, sel)
	}
	names := sliceNames(name, local.Name)

	// Local cluster: our slices when the Service has no selector of its own.
	if L != nil {
		want := contributes && len(newL.Spec.Selector) == 0 && mode != ModeSingular
		p.Local.Upsert, p.Local.Delete = slicesFor(local.Slices, L, local.Name, names, wanted(want, eps, L), ports, len(newL.Spec.Selector) == 0)
		for _, s := range local.Slices {
			if s.Labels[discoveryv1.LabelManagedBy] == mirroredSliceManager && slices.Contains(p.Local.Delete, s.Name) {
				p.Local.DeleteEndpoints = true
			}
		}
	}

	var replica *corev1.Service
	if owner {
		replica = replicaOf(L, newL, local.Name)
	}
	for _, peer := range peers {
		c := Changes{Cluster: peer.Name, Namespace: ns, Name: name, Service: peerSvc[peer.Name]}
		ps := peer.Service
		ours := isOurReplica(ps, local.Name)
		switch {
		case owner && ps == nil:
			c.Service = replica.DeepCopy()
			p.Events = append(p.Events, Event{corev1.EventTypeNormal, "Replicated", "replicated to " + peer.Name})
		case owner && ours && c.Service == nil:
			if !sameReplica(ps, replica) {
				// Ours, so its labels already name us; only the spec and the
				// union selector change.
				r := replica.DeepCopy()
				r.ObjectMeta = *ps.ObjectMeta.DeepCopy()
				r.Annotations = replicaAnnotations(ps.Annotations, newL)
				if (ps.Spec.ClusterIP == corev1.ClusterIPNone) != (r.Spec.ClusterIP == corev1.ClusterIPNone) {
					c.DeleteService, c.DeleteUID = true, ps.UID // headless or not cannot change in place: recreated next time
				} else {
					policy := ps.Spec.IPFamilyPolicy
					if dualStack(r) {
						policy = r.Spec.IPFamilyPolicy // a source made dual-stack: the peer adds its second family
					}
					r.Spec.ClusterIP, r.Spec.ClusterIPs, r.Spec.IPFamilies, r.Spec.IPFamilyPolicy = ps.Spec.ClusterIP, ps.Spec.ClusterIPs, ps.Spec.IPFamilies, policy
					c.Service = r
				}
			}
		case !owner && ours && (L == nil || mode == ModeSingular || L.DeletionTimestamp != nil || isReplica):
			c.DeleteService, c.DeleteUID = true, ps.UID
		case owner && ps != nil && ownService(ps, local.Name):
			p.Events = append(p.Events, Event{corev1.EventTypeWarning, "NameClash", fmt.Sprintf(
				"%s has its own Service %s/%s with a selector; it is left alone and not replicated to", peer.Name, ps.Namespace, ps.Name)})
		}
		if c.DeleteService {
			p.Peers = append(p.Peers, c)
			continue
		}
		serves := ps != nil || c.Service != nil
		want := contributes && serves && ModeOf(ps) != ModeSingular && !(ps != nil && ownService(ps, local.Name))
		target := ps
		if target == nil {
			target = c.Service
		}
		c.Upsert, c.Delete = slicesFor(peer.Slices, target, local.Name, names, wanted(want, eps, target), ports, false)
		if ps == nil && c.Service == nil {
			c.Upsert = nil
		}
		if !c.Empty() {
			p.Peers = append(p.Peers, c)
		}
	}
	return p
}

// ownService is a peer's Service of its own, not part of a migration: it
// is never written to.
func ownService(ps *corev1.Service, us string) bool {
	m := ModeOf(ps)
	return !isOurReplica(ps, us) && len(ps.Spec.Selector) > 0 && (m == ModeDefault || m == ModeSingular)
}

func isOurReplica(s *corev1.Service, cluster string) bool {
	return s != nil && s.Labels[LabelSourceCluster] == cluster
}

// contributionSelector is the selector of the pods this cluster serves.
func contributionSelector(svc *corev1.Service, mode Mode) (labels.Selector, bool) {
	if svc == nil || svc.DeletionTimestamp != nil || mode == ModeSingular {
		return nil, false
	}
	var m map[string]string
	switch {
	case len(svc.Spec.Selector) > 0:
		m = svc.Spec.Selector
	case (mode == ModeReceiver || mode == ModeUnion) && svc.Annotations[AnnotationSelector] != "":
		_ = json.Unmarshal([]byte(svc.Annotations[AnnotationSelector]), &m)
	case svc.Annotations[AnnotationUnionSelector] != "":
		_ = json.Unmarshal([]byte(svc.Annotations[AnnotationUnionSelector]), &m)
	}
	if len(m) == 0 {
		return nil, false
	}
	return labels.SelectorFromSet(m), true
}

// othersReady: another cluster already serves ready endpoints here.
func othersReady(slices []discoveryv1.EndpointSlice, us string) bool {
	for _, s := range slices {
		if src := s.Labels[LabelSourceCluster]; src != "" && src != us && hasReady(s) {
			return true
		}
	}
	return false
}

func hasReady(s discoveryv1.EndpointSlice) bool {
	for _, e := range s.Endpoints {
		if kube.EndpointReady(e.Conditions) {
			return true
		}
	}
	return false
}

// families are the address types slices are made for, in the order they
// are planned.
var families = []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}

// sliceNames names our slice of each family: the IPv4 one keeps the name
// slices had before there were two.
func sliceNames(service, cluster string) map[discoveryv1.AddressType]string {
	base := SliceName(service, cluster)
	return map[discoveryv1.AddressType]string{discoveryv1.AddressTypeIPv4: base, discoveryv1.AddressTypeIPv6: base + "-v6"}
}

// wanted is which families get a slice: each that has endpoints; with
// none, the Service's primary family, so that an empty slice says this
// cluster serves nothing.
func wanted(want bool, eps map[discoveryv1.AddressType][]discoveryv1.Endpoint, svc *corev1.Service) map[discoveryv1.AddressType][]discoveryv1.Endpoint {
	if !want {
		return nil
	}
	out := map[discoveryv1.AddressType][]discoveryv1.Endpoint{}
	for f, e := range eps {
		if len(e) > 0 {
			out[f] = e
		}
	}
	if len(out) == 0 {
		primary := discoveryv1.AddressTypeIPv4
		if svc != nil && len(svc.Spec.IPFamilies) > 0 && svc.Spec.IPFamilies[0] == corev1.IPv6Protocol {
			primary = discoveryv1.AddressTypeIPv6
		}
		out[primary] = nil
	}
	return out
}

// slicesFor plans our slices (one per family in want) in one cluster. A
// slice we no longer want, and (where the selector was removed) the
// EndpointSlice controller's orphaned slices, go only once another slice
// there has ready endpoints, or the Service is gone.
func slicesFor(existing []discoveryv1.EndpointSlice, svc *corev1.Service, us string, names map[discoveryv1.AddressType]string, want map[discoveryv1.AddressType][]discoveryv1.Endpoint, ports []discoveryv1.EndpointPort, dropKube bool) (upsert []*discoveryv1.EndpointSlice, del []string) {
	byName := map[string]*discoveryv1.EndpointSlice{}
	for i := range existing {
		byName[existing[i].Name] = &existing[i]
	}
	var retiring []string
	serving := false
	for _, f := range families {
		name := names[f]
		cur := byName[name]
		eps, ok := want[f]
		if !ok {
			if cur != nil {
				retiring = append(retiring, name)
			}
			continue
		}
		serving = serving || len(eps) > 0
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svc.Namespace, Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: ManagedBy, LabelSourceCluster: us}},
			AddressType: f, Endpoints: eps, Ports: ports,
		}
		if cur == nil || cur.AddressType != f || !equality.Semantic.DeepEqual(cur.Endpoints, s.Endpoints) || !equality.Semantic.DeepEqual(cur.Ports, s.Ports) || !maps.Equal(cur.Labels, s.Labels) {
			if cur != nil {
				s.ResourceVersion = cur.ResourceVersion
				s.OwnerReferences = cur.OwnerReferences
			}
			upsert = append(upsert, s)
		}
	}
	if dropKube {
		for _, s := range existing {
			if m := s.Labels[discoveryv1.LabelManagedBy]; m == kubeSliceManager || m == mirroredSliceManager {
				retiring = append(retiring, s.Name)
			}
		}
	}
	if len(retiring) == 0 {
		return upsert, nil
	}
	othersServe := serving
	for _, s := range existing {
		if !slices.Contains(retiring, s.Name) && hasReady(s) {
			othersServe = true
		}
	}
	if othersServe || svc == nil || svc.DeletionTimestamp != nil || ModeOf(svc) == ModeSingular {
		return upsert, retiring
	}
	return upsert, nil
}

// endpointsOf lists the ready pods matching sel by address family (one
// endpoint per pod and family, from status.podIPs; only the Service's
// families when it has them, as the EndpointSlice controller does), with
// the Service's ports resolved against them.
func endpointsOf(svc *corev1.Service, pods []corev1.Pod, sel labels.Selector) (map[discoveryv1.AddressType][]discoveryv1.Endpoint, []discoveryv1.EndpointPort) {
	eps := map[discoveryv1.AddressType][]discoveryv1.Endpoint{}
	var matched []corev1.Pod
	for _, pod := range pods {
		if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" || !sel.Matches(labels.Set(pod.Labels)) || !podReady(pod) {
			continue
		}
		matched = append(matched, pod)
		for f, ip := range podAddresses(pod) {
			if !serviceFamily(svc, f) {
				continue
			}
			ep := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}
			if pod.Spec.Hostname != "" {
				ep.Hostname = ptr.To(pod.Spec.Hostname)
			}
			eps[f] = append(eps[f], ep)
		}
	}
	for _, e := range eps {
		sort.Slice(e, func(i, j int) bool { return e[i].Addresses[0] < e[j].Addresses[0] })
	}
	var ports []discoveryv1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		port := sp.TargetPort.IntVal
		if sp.TargetPort.StrVal != "" {
			port = namedPort(matched, sp.TargetPort.StrVal)
		} else if port == 0 {
			port = sp.Port
		}
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr.To(sp.Name), Protocol: ptr.To(sp.Protocol), Port: ptr.To(port), AppProtocol: sp.AppProtocol})
	}
	return eps, ports
}

func serviceFamily(svc *corev1.Service, f discoveryv1.AddressType) bool {
	if svc == nil || len(svc.Spec.IPFamilies) == 0 {
		return true
	}
	for _, fam := range svc.Spec.IPFamilies {
		if string(fam) == string(f) {
			return true
		}
	}
	return false
}

// podAddresses is a pod's address of each family (status.podIPs, else
// status.podIP).
func podAddresses(pod corev1.Pod) map[discoveryv1.AddressType]string {
	ips := []string{pod.Status.PodIP}
	if len(pod.Status.PodIPs) > 0 {
		ips = ips[:0]
		for _, ip := range pod.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
	}
	out := map[discoveryv1.AddressType]string{}
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			continue
		}
		f := discoveryv1.AddressTypeIPv4
		if a.Is6() && !a.Is4In6() {
			f = discoveryv1.AddressTypeIPv6
		}
		if _, dup := out[f]; !dup {
			out[f] = ip
		}
	}
	return out
}

func namedPort(pods []corev1.Pod, name string) int32 {
	for _, pod := range pods {
		for _, c := range pod.Spec.Containers {
			for _, p := range c.Ports {
				if p.Name == name {
					return p.ContainerPort
				}
			}
		}
	}
	return 0
}

func podReady(pod corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// replicaOf is the selector-less copy of a source Service for a peer.
func replicaOf(L, newL *corev1.Service, us string) *corev1.Service {
	r := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: L.Name, Namespace: L.Namespace,
			Labels:      map[string]string{LabelSourceCluster: us},
			Annotations: replicaAnnotations(nil, newL)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, SessionAffinity: L.Spec.SessionAffinity, PublishNotReadyAddresses: L.Spec.PublishNotReadyAddresses},
	}
	if L.Spec.ClusterIP == corev1.ClusterIPNone {
		r.Spec.ClusterIP = corev1.ClusterIPNone
	}
	// A dual-stack Service is dual-stack where the peer can be; its
	// families are the peer's to choose.
	if p := L.Spec.IPFamilyPolicy; p != nil && *p != corev1.IPFamilyPolicySingleStack {
		r.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	}
	for _, p := range L.Spec.Ports {
		r.Spec.Ports = append(r.Spec.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, AppProtocol: p.AppProtocol})
	}
	return r
}

// replicaAnnotations carries a union's selector to replicas.
func replicaAnnotations(cur map[string]string, newL *corev1.Service) map[string]string {
	out := maps.Clone(cur)
	if out == nil {
		out = map[string]string{}
	}
	delete(out, AnnotationUnionSelector)
	if ModeOf(newL) == ModeUnion {
		out[AnnotationUnionSelector] = newL.Annotations[AnnotationSelector]
	}
	return out
}

// dualStack: the Service asks for more than one family.
func dualStack(s *corev1.Service) bool {
	return s.Spec.IPFamilyPolicy != nil && *s.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack
}

func sameReplica(cur, want *corev1.Service) bool {
	if cur.Annotations[AnnotationUnionSelector] != want.Annotations[AnnotationUnionSelector] ||
		(cur.Spec.ClusterIP == corev1.ClusterIPNone) != (want.Spec.ClusterIP == corev1.ClusterIPNone) || len(cur.Spec.Ports) != len(want.Spec.Ports) ||
		(dualStack(want) && !dualStack(cur)) {
		return false
	}
	for i, p := range want.Spec.Ports {
		c := cur.Spec.Ports[i]
		if c.Name != p.Name || c.Protocol != p.Protocol || c.Port != p.Port {
			return false
		}
	}
	return true
}

// SliceName is the name of the slice a cluster writes for a Service.
func SliceName(service, cluster string) string {
	h := sha256.Sum256([]byte(cluster))
	return fmt.Sprintf("%.50s-syn-%s", service, hex.EncodeToString(h[:4]))
}

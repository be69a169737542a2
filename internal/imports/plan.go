// Package imports makes every cluster's exports of a service into, in each
// member cluster, a ServiceImport, a derived selector-less Service giving
// the clusterset VIP, and EndpointSlices listing every cluster's endpoints.
package imports

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/internal/merge"
	"github.com/clustermap/clustermap/internal/registry"
)

// Labels on everything clustermap creates for an import.
const (
	// ManagedBy is our EndpointSlice manager: never the EndpointSlice
	// controller's, so that it leaves our slices alone.
	ManagedBy      = "controller.clustermap.io"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedByValue = "clustermap"
	// LabelDerivedFor marks a derived Service with its import's name.
	LabelDerivedFor = "clustermap.io/derived-for"
	// MaxEndpointsPerSlice is the slice size the MCS API asks for.
	MaxEndpointsPerSlice = 100
)

// DerivedName names the selector-less Service that holds an import's VIP:
// a DNS label that cannot be mistaken for a user's Service.
func DerivedName(name string) string {
	sum := sha256.Sum256([]byte(name))
	if len(name) > 45 {
		name = name[:45]
	}
	return strings.TrimRight(name, "-") + "-mcs-" + hex.EncodeToString(sum[:])[:8]
}

// DerivedServiceAnnotation names an import's derived Service, where
// Gateway API implementations that route to a ServiceImport (GEP-1748)
// find its clusterset IP and endpoints. Exported annotations never carry
// it (multicluster.kubernetes.io is a denied prefix).
const DerivedServiceAnnotation = "multicluster.kubernetes.io/derived-service"

// SourceRegionsAnnotation lists the Regions an import's exports were read
// from: after a restart, an import whose Regions show no export of any
// other cluster is held, not removed (a Region dropped from the
// configuration reads as exporting nothing).
const SourceRegionsAnnotation = "clustermap.io/source-regions"

// Desired is what one cluster should hold for one imported service.
type Desired struct {
	Import *mcsv1beta1.ServiceImport
	// Service is the derived Service; nil for headless imports.
	Service *corev1.Service
	Slices  []*discoveryv1.EndpointSlice
}

// Plan computes the objects of an import from the merged exports. IPs of
// the ServiceImport are left to the caller: they are the derived Service's.
// Hints, when set, are the zones each endpoint serves (locality.Hints).
func Plan(key registry.Key, m merge.Result, hints map[locality.Endpoint][]string) Desired {
	labels := map[string]string{LabelManagedBy: managedByValue, mcsv1beta1.LabelServiceName: key.Name}
	si := &mcsv1beta1.ServiceImport{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: exportable(m.Labels), Annotations: exportable(m.Annotations)},
		Spec:       m.Spec,
	}
	si.Spec.IPs = nil
	if si.Spec.Ports == nil {
		// Required by the CRD, empty allowed: exports without a port (a
		// headless Service may have none).
		si.Spec.Ports = []mcsv1beta1.ServicePort{}
	}
	if si.Labels == nil {
		si.Labels = map[string]string{}
	}
	si.Labels[LabelManagedBy] = managedByValue
	for _, c := range m.Clusters() {
		si.Status.Clusters = append(si.Status.Clusters, mcsv1beta1.ClusterStatus{Cluster: c})
	}
	var regions []string
	for _, e := range m.Exports {
		if e.Region != "" && !slices.Contains(regions, e.Region) {
			regions = append(regions, e.Region)
		}
	}
	if len(regions) > 0 {
		if si.Annotations == nil {
			si.Annotations = map[string]string{}
		}
		slices.Sort(regions)
		si.Annotations[SourceRegionsAnnotation] = strings.Join(regions, ",")
	}
	// KEP-1645: consumers (Gateway API implementations) read the imported
	// EndpointSlices, which clustermap always writes.
	si.Status.EndpointSliceObjects = mcsv1beta1.EndpointSliceObjectsPresent
	d := Desired{Import: si}
	sliceOwner := key.Name
	if m.Spec.Type == mcsv1beta1.ClusterSetIP && len(m.Spec.Ports) > 0 {
		d.Service = derivedService(key, m, labels)
		sliceOwner = d.Service.Name
		if si.Annotations == nil {
			si.Annotations = map[string]string{}
		}
		si.Annotations[DerivedServiceAnnotation] = d.Service.Name
	}
	for _, e := range m.Exports {
		d.Slices = append(d.Slices, slicesOf(key, e, m.Spec, sliceOwner, d.Service != nil, hints)...)
	}
	return d
}

func derivedService(key registry.Key, m merge.Result, labels map[string]string) *corev1.Service {
	svcLabels := maps.Clone(labels)
	svcLabels[LabelDerivedFor] = key.Name
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: DerivedName(key.Name), Namespace: key.Namespace, Labels: svcLabels},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeClusterIP,
			SessionAffinity:       m.Spec.SessionAffinity,
			SessionAffinityConfig: m.Spec.SessionAffinityConfig,
			IPFamilies:            m.Spec.IPFamilies,
			InternalTrafficPolicy: m.Spec.InternalTrafficPolicy,
			TrafficDistribution:   m.Spec.TrafficDistribution,
		},
	}
	switch len(m.Spec.IPFamilies) {
	case 0:
	case 1:
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	default:
		// Prefer, not require: a single-stack cluster gets the family it
		// has (createService tries each alone).
		svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
	}
	for _, p := range m.Spec.Ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: portName(p, m.Spec.Ports), Protocol: p.Protocol, AppProtocol: p.AppProtocol, Port: p.Port, TargetPort: intstr.FromInt32(p.Port),
		})
	}
	return svc
}

// portName is the name an import's port p goes by in its derived Service
// and EndpointSlices (kube-proxy pairs them by name): its own, or, for an
// unnamed port among several (clusters that each export one port, one of
// them unnamed: a Service of several ports must name each), one made of
// its protocol and number.
func portName(p mcsv1beta1.ServicePort, ports []mcsv1beta1.ServicePort) string {
	if p.Name != "" || len(ports) < 2 {
		return p.Name
	}
	name := strings.ToLower(string(p.Protocol)) + "-" + strconv.Itoa(int(p.Port))
	for _, q := range ports {
		if q.Name == name {
			return "mcs-" + name // taken by a named port
		}
	}
	return name
}

// slicesOf renders one cluster's endpoints as EndpointSlices: one set per
// address family and port set, at most 100 endpoints each, with stable
// names so that updates touch only what changed.
//
// An endpoint port whose service port lost a port conflict (the import
// defines its name or number otherwise) is left out: traffic to the
// import's port reaches only the clusters that define it so.
func slicesOf(key registry.Key, e registry.Export, spec mcsv1beta1.ServiceImportSpec, owner string, routed bool, hints map[locality.Endpoint][]string) []*discoveryv1.EndpointSlice {
	typ := spec.Type
	type addr struct {
		ready, serving, terminating bool
		hostname, zone              string
		ports                       []discoveryv1.EndpointPort
	}
	addrs := map[string]*addr{}
	var order []string
	for _, ep := range e.Endpoints {
		a := addrs[ep.IP]
		if a == nil {
			a = &addr{ready: true, serving: true, hostname: ep.Hostname, zone: ep.Zone}
			addrs[ep.IP] = a
			order = append(order, ep.IP)
		}
		a.ready = a.ready && ep.Ready
		a.serving = a.serving && (ep.Serving || ep.Ready) // ready implies serving
		a.terminating = a.terminating || ep.Terminating
		if !servesImportPort(ep.ServicePort, spec.Ports) {
			continue
		}
		name := ep.PortName
		if name == "" {
			name = ep.ServicePort.Name
		}
		if name == "" && ep.ServicePort.Port != 0 {
			name = portName(ep.ServicePort, spec.Ports)
		}
		a.ports = append(a.ports, discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(ep.Protocol), Port: ptr.To(ep.Port), AppProtocol: ep.ServicePort.AppProtocol})
	}
	type group struct {
		family discoveryv1.AddressType
		ports  []discoveryv1.EndpointPort
		ips    []string
	}
	groups := map[string]*group{}
	var gkeys []string
	for _, ip := range order {
		a := addrs[ip]
		sort.Slice(a.ports, func(i, j int) bool {
			return *a.ports[i].Name < *a.ports[j].Name || (*a.ports[i].Name == *a.ports[j].Name && *a.ports[i].Port < *a.ports[j].Port)
		})
		fam := discoveryv1.AddressTypeIPv4
		if p, err := netip.ParseAddr(ip); err == nil && p.Is6() {
			fam = discoveryv1.AddressTypeIPv6
		}
		gk := string(fam) + portsKey(a.ports)
		g := groups[gk]
		if g == nil {
			g = &group{family: fam, ports: a.ports}
			groups[gk] = g
			gkeys = append(gkeys, gk)
		}
		g.ips = append(g.ips, ip)
	}
	sort.Strings(gkeys)
	var out []*discoveryv1.EndpointSlice
	for _, gk := range gkeys {
		g := groups[gk]
		sort.Strings(g.ips)
		sum := sha256.Sum256([]byte(e.Cluster + "/" + gk))
		for n := 0; n*MaxEndpointsPerSlice < len(g.ips); n++ {
			chunk := g.ips[n*MaxEndpointsPerSlice : min((n+1)*MaxEndpointsPerSlice, len(g.ips))]
			s := &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{
					Name:      fmt.Sprintf("%s-%s-%d", owner, hex.EncodeToString(sum[:])[:10], n),
					Namespace: key.Namespace,
					Labels: map[string]string{
						LabelManagedBy:                managedByValue,
						discoveryv1.LabelManagedBy:    ManagedBy,
						mcsv1beta1.LabelServiceName:   key.Name,
						mcsv1beta1.LabelSourceCluster: e.Cluster,
					},
				},
				AddressType: g.family,
				Ports:       g.ports,
			}
			if routed {
				// kube-proxy routes the derived Service's VIP to these.
				s.Labels[discoveryv1.LabelServiceName] = owner
			}
			for _, ip := range chunk {
				a := addrs[ip]
				ep := discoveryv1.Endpoint{
					Addresses:  []string{ip},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(a.ready), Serving: ptr.To(a.serving), Terminating: ptr.To(a.terminating)},
				}
				if !e.Silent.IsZero() {
					// Drained: kept, routed to by nothing (kube-proxy takes
					// no endpoint that is neither ready nor serving).
					ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
				}
				if a.zone != "" {
					// Not the node name: a node of another cluster may share
					// a local node's name, and kube-proxy would take it as local.
					ep.Zone = ptr.To(a.zone)
				}
				if typ == mcsv1beta1.Headless && a.hostname != "" {
					ep.Hostname = ptr.To(a.hostname)
				}
				if zones := hints[locality.Endpoint{Cluster: e.Cluster, IP: ip}]; len(zones) > 0 {
					ep.Hints = &discoveryv1.EndpointHints{}
					for _, z := range zones {
						ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
					}
				}
				s.Endpoints = append(s.Endpoints, ep)
			}
			out = append(out, s)
		}
	}
	return out
}

func portsKey(ports []discoveryv1.EndpointPort) string {
	var b strings.Builder
	for _, p := range ports {
		fmt.Fprintf(&b, "|%s/%s/%d", *p.Name, *p.Protocol, *p.Port)
	}
	return b.String()
}

// servesImportPort tells whether an endpoint's service port is one of the
// import's as defined there; an unknown one (an export of the AWS
// controller's says none) is taken as it comes.
func servesImportPort(sp mcsv1beta1.ServicePort, ports []mcsv1beta1.ServicePort) bool {
	if sp.Port == 0 {
		return true
	}
	for _, p := range ports {
		if p.Name == sp.Name && p.Port == sp.Port && p.Protocol == sp.Protocol {
			return true
		}
	}
	return false
}

// capEndpoints cuts each cluster's export to at most most endpoint
// records, saying so (Capped); the exports it is given are shared and
// left as they are.
func capEndpoints(exports []registry.Export, most int) []registry.Export {
	out := exports
	for i, e := range exports {
		if len(e.Endpoints) > most {
			if len(out) > 0 && &out[0] == &exports[0] {
				out = slices.Clone(exports)
			}
			out[i].Endpoints, out[i].Capped = e.Endpoints[:most:most], most
		}
	}
	return out
}

// checkPorts holds a derived Service's ports to the API server's rules
// for them (merged from several clusters, they were never checked
// together): every port named, validly and once, when there are several,
// and no number twice for a protocol.
func checkPorts(svc *corev1.Service) error {
	if svc == nil {
		return nil
	}
	names := map[string]bool{}
	numbers := map[string]bool{}
	ports := svc.Spec.Ports
	for _, p := range ports {
		if p.Name == "" && len(ports) > 1 {
			return fmt.Errorf("port %d/%s has no name beside others", p.Port, p.Protocol)
		}
		if p.Name != "" {
			if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
				return fmt.Errorf("port name %q: %s", p.Name, strings.Join(errs, "; "))
			}
			if names[p.Name] {
				return fmt.Errorf("port name %q twice", p.Name)
			}
			names[p.Name] = true
		}
		n := fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		if numbers[n] {
			return fmt.Errorf("port %s twice", n)
		}
		numbers[n] = true
	}
	return nil
}

// drainFloor keeps a Service's last exporters routed: when no cluster
// that proves alive exports a ready endpoint of it, no silent cluster is
// drained (their pods may well serve; draining them would leave the
// Service no endpoint anywhere). It returns the exports to plan with and
// the silent clusters so kept.
func drainFloor(exports []registry.Export) ([]registry.Export, []string) {
	silent := false
	for _, e := range exports {
		if !e.Silent.IsZero() {
			silent = true
			continue
		}
		for _, ep := range e.Endpoints {
			if ep.Ready {
				return exports, nil
			}
		}
	}
	if !silent {
		return exports, nil
	}
	out := slices.Clone(exports)
	var kept []string
	for i := range out {
		if !out[i].Silent.IsZero() {
			kept = append(kept, silentFor(out[i]))
			out[i].Silent = time.Time{}
		}
	}
	slices.Sort(kept)
	return out, kept
}

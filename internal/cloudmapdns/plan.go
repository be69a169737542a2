// Package cloudmapdns registers the ready endpoints of annotated Services
// as instances of Cloud Map services in existing namespaces (DNS or HTTP),
// beside whatever else (ECS) registers there, touching only its own.
package cloudmapdns

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/clustermap/clustermap/internal/cloudmapclient/diff"
	"github.com/clustermap/clustermap/internal/kube"
)

// The annotation keys are those of the CloudMap Kubernetes Controller, so
// its users switch without edits.
const (
	AnnotationNamespace = "cloudmap.controller/namespace"
	AnnotationHostname  = "cloudmap.controller/hostname"
)

// Instance attributes. AWS_* are Cloud Map's; the rest name where an
// instance comes from. AttrOwner marks an instance as ours: only instances
// carrying our owner value are ever changed or deregistered.
const (
	AttrIPv4      = "AWS_INSTANCE_IPV4"
	AttrIPv6      = "AWS_INSTANCE_IPV6"
	AttrPort      = "AWS_INSTANCE_PORT"
	AttrCluster   = "K8S_CLUSTER"
	AttrNamespace = "K8S_NAMESPACE"
	AttrService   = "K8S_SERVICE"
	AttrPod       = "K8S_POD"
	AttrOwner     = "CLUSTERMAP_OWNER"
)

// Target is where a Service asks to be registered.
type Target struct{ Namespace, Hostname string }

func (t Target) String() string { return t.Namespace + "/" + t.Hostname }

// ParseTarget reads "namespace/hostname" as written by Target.String.
func ParseTarget(s string) (Target, bool) {
	ns, host, ok := strings.Cut(s, "/")
	return Target{ns, host}, ok && ns != "" && host != ""
}

// A hostname becomes a Cloud Map service name and a DNS label: letters,
// digits, '-' and '_' (for SRV-style names), not starting or ending with '-'.
var (
	hostnameRE  = regexp.MustCompile(`^([a-zA-Z0-9_][a-zA-Z0-9_-]{0,61}[a-zA-Z0-9_]|[a-zA-Z0-9_])$`)
	namespaceRE = regexp.MustCompile(`^[!-~]+$`)
)

// TargetOf reads a Service's annotations: ok is false when it has neither
// key; err says what is wrong when the pair is incomplete or invalid.
func TargetOf(svc *corev1.Service) (t Target, ok bool, err error) {
	ns, hasNS := svc.Annotations[AnnotationNamespace]
	host, hasHost := svc.Annotations[AnnotationHostname]
	switch {
	case !hasNS && !hasHost:
		return t, false, nil
	case !hasHost:
		return t, true, fmt.Errorf("annotation %s is set but %s is missing; set both to register, or neither", AnnotationNamespace, AnnotationHostname)
	case !hasNS:
		return t, true, fmt.Errorf("annotation %s is set but %s is missing; set both to register, or neither", AnnotationHostname, AnnotationNamespace)
	case !namespaceRE.MatchString(ns) || len(ns) > 1024:
		return t, true, fmt.Errorf("annotation %s=%q is not a Cloud Map namespace name (1-1024 printable characters, no spaces)", AnnotationNamespace, ns)
	case !hostnameRE.MatchString(host):
		return t, true, fmt.Errorf("annotation %s=%q is not a valid hostname: use 1-63 letters, digits, '-' or '_', not starting or ending with '-'", AnnotationHostname, host)
	}
	return Target{ns, host}, true, nil
}

// Owner names a Service across clusters; it is the AttrOwner value and the
// claim on a Cloud Map service.
func Owner(cluster string, svc *corev1.Service) string {
	return cluster + "/" + svc.Namespace + "/" + svc.Name
}

// Attrs are an instance's attributes.
type Attrs = map[string]string

// InstanceID is stable for an owner and address, and differs between
// owners so that two clusters reusing an IP never share an instance.
func InstanceID(owner, ip string) string {
	h := sha256.Sum256([]byte(owner))
	return "k8s-" + hex.EncodeToString(h[:5]) + "-" + ip
}

// Family is the address family a Service registers: its first one.
func Family(svc *corev1.Service) corev1.IPFamily {
	if len(svc.Spec.IPFamilies) > 0 {
		return svc.Spec.IPFamilies[0]
	}
	return corev1.IPv4Protocol
}

// Desired is the instances a Service's ready endpoints should be: one per
// address of the Service's family, with the endpoint port of the Service's
// first port (SRV records carry one port).
func Desired(cluster string, svc *corev1.Service, slices []discoveryv1.EndpointSlice) map[string]Attrs {
	owner := Owner(cluster, svc)
	addrType, ipAttr := discoveryv1.AddressTypeIPv4, AttrIPv4
	if Family(svc) == corev1.IPv6Protocol {
		addrType, ipAttr = discoveryv1.AddressTypeIPv6, AttrIPv6
	}
	out := map[string]Attrs{}
	for _, s := range slices {
		if s.AddressType != addrType {
			continue
		}
		port := slicePort(svc, s)
		for _, ep := range s.Endpoints {
			if !kube.EndpointReady(ep.Conditions) {
				continue
			}
			for _, ip := range ep.Addresses {
				a := Attrs{ipAttr: ip, AttrCluster: cluster, AttrNamespace: svc.Namespace, AttrService: svc.Name, AttrOwner: owner}
				if port > 0 {
					a[AttrPort] = strconv.Itoa(int(port))
				}
				if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
					a[AttrPod] = ep.TargetRef.Name
				}
				out[InstanceID(owner, ip)] = a
			}
		}
	}
	return out
}

// slicePort is the endpoint port behind the Service's first port, 0 when
// there is none.
func slicePort(svc *corev1.Service, s discoveryv1.EndpointSlice) int32 {
	if len(svc.Spec.Ports) == 0 {
		return 0
	}
	want := svc.Spec.Ports[0]
	for _, p := range s.Ports {
		if p.Port != nil && (p.Name == nil && want.Name == "" || p.Name != nil && *p.Name == want.Name) {
			return *p.Port
		}
	}
	return 0
}

// Diff says what to change in a Service's Cloud Map instances: of those
// found, only the ones carrying one of owners are ours to change, and an
// instance is written again when any of its attributes differs.
func Diff(owners []string, desired, current map[string]Attrs) diff.Changes {
	return diff.Instances(desired, current, func(a Attrs) bool { return slices.Contains(owners, a[AttrOwner]) }, maps.Equal)
}

// Change is one Event (and metric) for what a sync did.
type Change struct {
	Action, Reason, Message string // Action labels the instances metric
	Count                   int
}

// Changes says what a sync that registered reg and deregistered dereg
// did. remembered, when the sync read Cloud Map again (a drift check, or
// a read once writes ended), is what memory held before the read (nil
// otherwise): a registration memory held is a repair (its instance was
// gone), a deregistration memory did not hold removes a stale instance;
// the rest follow the endpoints, as in any sync (a read may come as pods
// come and go).
func Changes(target Target, remembered, before, desired map[string]Attrs, reg, dereg []string) []Change {
	var out []Change
	add := func(ids []string, attrs map[string]Attrs, action, reason, format string) {
		if len(ids) > 0 {
			out = append(out, Change{Action: action, Reason: reason, Message: fmt.Sprintf(format, IPs(attrs, ids), target), Count: len(ids)})
		}
	}
	split := func(ids []string) (known, unknown []string) {
		for _, id := range ids {
			if _, ok := remembered[id]; ok {
				known = append(known, id)
			} else {
				unknown = append(unknown, id)
			}
		}
		return known, unknown
	}
	if remembered == nil {
		add(reg, desired, "registered", ReasonRegistered, "Registered %s to %s")
		add(dereg, before, "deregistered", ReasonDeregistered, "Deregistered %s from %s")
		return out
	}
	restored, added := split(reg)
	left, stale := split(dereg)
	add(added, desired, "registered", ReasonRegistered, "Registered %s to %s")
	add(restored, desired, "restored", ReasonDriftRepaired, "Restored %s in %s")
	add(left, before, "deregistered", ReasonDeregistered, "Deregistered %s from %s")
	add(stale, before, "stale_removed", ReasonStaleRemoved, "Deregistered stale IP %s from %s")
	return out
}

// Intent is what to do with one Service: register it at Target (if set),
// withdraw it from every place in Withdraw, report Invalid, or take our
// condition off a Service no longer annotated.
type Intent struct {
	Target         Target
	Withdraw       []Target
	Invalid        error
	ClearCondition bool
}

// Intend decides from the Service, whether its namespace is in scope, the
// Cloud Map namespaces registrations are allowed in (any when none), and
// where it is known to be registered: the annotation clustermap writes
// (it survives restarts) and, if any, where memory says (it covers the
// annotation's removal by a user).
func Intend(svc *corev1.Service, inScope bool, allowed []string, remembered *Target) Intent {
	target, annotated, invalid := TargetOf(svc)
	if invalid == nil && annotated && len(allowed) > 0 && !slices.Contains(allowed, target.Namespace) {
		invalid = fmt.Errorf("annotation %s=%q names a Cloud Map namespace this controller may not register in (--cloudmap-dns-namespaces: %s); use one of those, or ask for the namespace to be added",
			AnnotationNamespace, target.Namespace, strings.Join(allowed, ", "))
	}
	var in Intent
	if annotated && invalid == nil && svc.DeletionTimestamp == nil && inScope {
		in.Target = target
	}
	var at []Target
	if t, ok := ParseTarget(svc.Annotations[AnnotationRegistered]); ok {
		at = append(at, t)
	}
	if remembered != nil && !slices.Contains(at, *remembered) {
		at = append(at, *remembered)
	}
	// The finalizer goes on before a claim is tried: a Service that has it
	// may hold the claim of the name it asks for (a crash between the
	// claim and the annotation), which is checked as it leaves.
	if annotated && invalid == nil && controllerutil.ContainsFinalizer(svc, Finalizer) && !slices.Contains(at, target) {
		at = append(at, target)
	}
	for _, t := range at {
		if t != in.Target {
			in.Withdraw = append(in.Withdraw, t)
		}
	}
	if in.Target == (Target{}) && svc.DeletionTimestamp == nil {
		in.Invalid = invalid
		in.ClearCondition = !annotated && meta.FindStatusCondition(svc.Status.Conditions, ConditionRegistered) != nil
	}
	return in
}

// IPs lists the addresses of instances, for messages.
func IPs(instances map[string]Attrs, ids []string) string {
	var ips []string
	for _, id := range ids {
		a := instances[id]
		ip := a[AttrIPv4]
		if ip == "" {
			ip = a[AttrIPv6]
		}
		ips = append(ips, ip)
	}
	if len(ips) > 10 {
		return strings.Join(ips[:10], ", ") + fmt.Sprintf(" and %d more", len(ips)-10)
	}
	return strings.Join(ips, ", ")
}

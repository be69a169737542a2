package recordfmt

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// Another cluster's records are untrusted input: what the API server
// would refuse in the objects an import makes (or accept, where it should
// not: an address a VIP must never lead to) is refused here, field by
// field, with apimachinery's validators, so that one bad record is
// skipped and reported rather than failing the import's writes.

// specialAddress says why an endpoint address must not be imported:
// loopback, link-local (169.254.169.254, the instance metadata, among
// them), multicast and unspecified addresses are nobody's pod, and the API
// server refuses them in EndpointSlices (Kubernetes 1.33 on).
func specialAddress(addr netip.Addr) string {
	switch {
	case addr.IsUnspecified():
		return "unspecified"
	case addr.IsLoopback():
		return "loopback"
	case addr.IsLinkLocalUnicast(), addr.IsLinkLocalMulticast():
		return "link-local"
	case addr.IsMulticast(), addr.IsInterfaceLocalMulticast():
		return "multicast"
	}
	return ""
}

// maxAffinitySeconds is the longest ClientIP affinity a Service takes.
const maxAffinitySeconds = 86400

// validPortName is an EndpointSlice or Service port name: empty, or a DNS
// label.
func validPortName(attr, name string) error {
	if name == "" {
		return nil
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("%s %q: %s", attr, name, strings.Join(errs, "; "))
	}
	return nil
}

// validateRecord drops, one by one, the service-record fields a
// ServiceImport or derived Service could not hold, and says which.
func validateRecord(e *registry.Export) error {
	var errs []error
	drop := func(what string, err error) { errs = append(errs, fmt.Errorf("%s: %w", what, err)) }
	switch e.Type {
	case mcsv1beta1.ClusterSetIP, mcsv1beta1.Headless, "":
	default:
		drop(AttrServiceType, fmt.Errorf("%q is not ClusterSetIP or Headless", e.Type))
		e.Type = mcsv1beta1.ClusterSetIP
	}
	if err := validServicePorts(e.Ports); err != nil {
		drop(AttrServicePorts, err)
		e.Ports = nil // the endpoint records' ports stand in
	}
	switch e.SessionAffinity {
	case "", corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP:
	default:
		drop(AttrSessionAffinity, fmt.Errorf("%q is not None or ClientIP", e.SessionAffinity))
		e.SessionAffinity, e.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
	}
	if !validFamilies(e.IPFamilies) {
		drop(AttrIPFamilies, fmt.Errorf("%v is not one or two distinct families of IPv4, IPv6", e.IPFamilies))
		e.IPFamilies = nil
	}
	if p := e.InternalTrafficPolicy; p != nil && *p != corev1.ServiceInternalTrafficPolicyCluster && *p != corev1.ServiceInternalTrafficPolicyLocal {
		drop(AttrInternalTrafficPolicy, fmt.Errorf("%q is not Cluster or Local", *p))
		e.InternalTrafficPolicy = nil
	}
	if d := e.TrafficDistribution; d != nil && *d != corev1.ServiceTrafficDistributionPreferClose &&
		*d != corev1.ServiceTrafficDistributionPreferSameZone && *d != corev1.ServiceTrafficDistributionPreferSameNode {
		drop(AttrTrafficDistribution, fmt.Errorf("%q is not PreferClose, PreferSameZone or PreferSameNode", *d))
		e.TrafficDistribution = nil
	}
	if list := metav1validation.ValidateLabels(e.Labels, field.NewPath(AttrExportedLabels)); len(list) > 0 {
		drop(AttrExportedLabels, list.ToAggregate())
		e.Labels = nil
	}
	if list := apivalidation.ValidateAnnotations(e.Annotations, field.NewPath(AttrExportedAnnotations)); len(list) > 0 {
		drop(AttrExportedAnnotations, list.ToAggregate())
		e.Annotations = nil
	}
	return errors.Join(errs...)
}

func validServicePorts(ports []mcsv1beta1.ServicePort) error {
	names := map[string]bool{}
	for _, p := range ports {
		if err := validPortName("name", p.Name); err != nil {
			return err
		}
		if len(ports) > 1 && p.Name == "" {
			return errors.New("a port of several has no name")
		}
		if names[p.Name] {
			return fmt.Errorf("port name %q is repeated", p.Name)
		}
		names[p.Name] = true
		if errs := validation.IsValidPortNum(int(p.Port)); len(errs) > 0 {
			return fmt.Errorf("port %d: %s", p.Port, strings.Join(errs, "; "))
		}
		if err := validProtocol(p.Protocol); err != nil {
			return err
		}
		if p.AppProtocol != nil {
			if errs := validation.IsQualifiedName(*p.AppProtocol); len(errs) > 0 {
				return fmt.Errorf("appProtocol %q: %s", *p.AppProtocol, strings.Join(errs, "; "))
			}
		}
	}
	return nil
}

func validProtocol(p corev1.Protocol) error {
	if p != corev1.ProtocolTCP && p != corev1.ProtocolUDP && p != corev1.ProtocolSCTP {
		return fmt.Errorf("protocol %q is not TCP, UDP or SCTP", p)
	}
	return nil
}

func validFamilies(fams []corev1.IPFamily) bool {
	if len(fams) > 2 || len(fams) == 2 && fams[0] == fams[1] {
		return false
	}
	for _, f := range fams {
		if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol {
			return false
		}
	}
	return true
}

// Who wrote a record is not proven by its CLUSTER_ID alone. clustermap's
// own records carry the cluster in their instance ids too; one whose id
// names another cluster is refused (an AWS controller's endpoint records
// have ids of their own and are taken as they are).
func idMismatch(id string, a Attrs) string {
	tag := clusterTag(a[AttrClusterSetID], a[AttrClusterID])
	switch {
	case a[AttrRecord] == RecordValue && id != ServiceRecordID(a[AttrClusterSetID], a[AttrClusterID]):
		return fmt.Sprintf("a service record of cluster %q under instance id %q, which is not that cluster's", a[AttrClusterID], id)
	case a[AttrRecord] == chunkRecord && chunkIndex(id, a[AttrClusterSetID], a[AttrClusterID]) < 0:
		return fmt.Sprintf("packed endpoints of cluster %q under instance id %q, which is not one of that cluster's", a[AttrClusterID], id)
	case a[AttrRecord] != RecordValue && WrittenByClustermap(a) && !strings.HasSuffix(id, "-"+tag):
		return fmt.Sprintf("an endpoint record of cluster %q under instance id %q, which does not end in that cluster's tag %q", a[AttrClusterID], id, tag)
	}
	return ""
}

// The export creation time decides which export wins a conflict (the
// oldest): one before any export could exist, or ahead of the clock by
// more than clock skew, is taken as now, so that it wins nothing.
var earliestExport = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

const creationSkew = time.Hour

func saneCreation(created, now time.Time) (time.Time, bool) {
	if created.IsZero() || !created.Before(earliestExport) && !created.After(now.Add(creationSkew)) {
		return created, true
	}
	return now, false
}

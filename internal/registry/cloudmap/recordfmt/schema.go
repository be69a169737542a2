// Package recordfmt is clustermap's record format on Cloud Map, pure (no AWS
// SDK): the attribute schema of endpoint and service records (the AWS
// Cloud Map MCS controller's, so both controllers share a clusterset),
// packed endpoint chunks, their validation and the caps on what a member's
// records can make a reader hold, and the choice between the formats.
// Package cloudmap does the I/O.
package recordfmt

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient/diff"
	"github.com/clustermap/clustermap/internal/registry"
)

// Attributes of the AWS controller's schema.
const (
	AttrIPv4               = "AWS_INSTANCE_IPV4"
	AttrIPv6               = "AWS_INSTANCE_IPV6"
	AttrPort               = "AWS_INSTANCE_PORT"
	AttrEndpointPortName   = "ENDPOINT_PORT_NAME"
	AttrEndpointProtocol   = "ENDPOINT_PROTOCOL"
	AttrReady              = "READY"
	AttrHostname           = "HOSTNAME"
	AttrNodeName           = "NODENAME"
	AttrClusterID          = "CLUSTER_ID"
	AttrClusterSetID       = "CLUSTERSET_ID"
	AttrServicePortName    = "SERVICE_PORT_NAME"
	AttrServicePort        = "SERVICE_PORT"
	AttrServiceTargetPort  = "SERVICE_TARGET_PORT"
	AttrServiceProtocol    = "SERVICE_PROTOCOL"
	AttrServiceType        = "SERVICE_TYPE"
	AttrExportCreationTime = "SERVICE_EXPORT_CREATION_TIMESTAMP"
	AttrController         = "K8S_CONTROLLER"
)

// Attributes of clustermap's service record.
const (
	AttrRecord                = "CLUSTERMAP_RECORD" // "service" on the service record
	AttrServicePorts          = "SERVICE_PORTS"     // JSON list of mcs ServicePorts
	AttrSessionAffinity       = "SESSION_AFFINITY"
	AttrSessionAffinityTime   = "SESSION_AFFINITY_TIMEOUT"
	AttrIPFamilies            = "IP_FAMILIES"
	AttrInternalTrafficPolicy = "INTERNAL_TRAFFIC_POLICY"
	AttrTrafficDistribution   = "TRAFFIC_DISTRIBUTION"
	AttrExportedLabels        = "EXPORTED_LABELS"      // JSON object
	AttrExportedAnnotations   = "EXPORTED_ANNOTATIONS" // JSON object
	// AttrRecordVersion is the format of a cluster's records, on its
	// service record; none means 1, the format before versions.
	AttrRecordVersion = "CLUSTERMAP_RECORD_VERSION"
	// AttrWritten is when the instance was last registered, in Unix
	// milliseconds: importers measure propagation from it. It is not
	// compared (ourKeys), so it changes only with a registration made for
	// another reason.
	AttrWritten = "CLUSTERMAP_WRITTEN"
	// Endpoint conditions and zone beside READY, on endpoint records, each
	// only when it says more than READY does.
	AttrServing     = "SERVING"
	AttrTerminating = "TERMINATING"
	AttrZone        = "ZONE"
)

// RecordVersion is the record format this release writes. It reads this
// one and every earlier one; a later one it reads as far as it can (formats
// only add attributes) and says so. A release that changes the format
// still reads the previous one, so clusters upgrade one at a time.
//
// Version 3 reads the packed format (pack.go): a cluster writes it only
// once every cluster of the clusterset writes version 3 or later.
const RecordVersion = 3

// PackedVersion is the first record format that reads packed endpoints.
const PackedVersion = 3

// ourKeys are the attributes clustermap compares when deciding whether an
// instance needs re-registering: attributes others add cause no churn, and
// neither does K8S_CONTROLLER, which changes with every upgrade.
var ourKeys = append([]string{
	AttrIPv4, AttrIPv6, AttrPort, AttrEndpointPortName, AttrEndpointProtocol, AttrReady, AttrHostname,
	AttrNodeName, AttrClusterID, AttrClusterSetID, AttrServicePortName, AttrServicePort, AttrServiceTargetPort,
	AttrServiceProtocol, AttrServiceType, AttrExportCreationTime, AttrRecord, AttrServicePorts,
	AttrSessionAffinity, AttrSessionAffinityTime, AttrIPFamilies, AttrInternalTrafficPolicy,
	AttrTrafficDistribution, AttrExportedLabels, AttrExportedAnnotations, AttrRecordVersion,
	AttrServing, AttrTerminating, AttrZone, AttrEndpointFormat, AttrWriter,
}, packedKeys...)

// Cloud Map limits on instance attributes.
const (
	maxValueLength   = 1024
	maxAttrsLength   = 5000
	maxAttrs         = 30
	MaxInstances     = 1000
	RecordValue      = "service"
	instanceIDLength = 64
)

// clusterTag is a short, stable stand-in for a cluster in instance ids, so
// that equal pod IPs in two clusters never give one id.
func clusterTag(clusterSet, cluster string) string {
	sum := sha256.Sum256([]byte(clusterSet + "/" + cluster))
	return hex.EncodeToString(sum[:])[:8]
}

// EndpointID is `<proto>-<ip with . and : as _>-<port>-<cluster tag>`: the
// AWS controller's id with the cluster added, at most 60 characters.
func EndpointID(clusterSet, cluster string, ep registry.Endpoint) string {
	ip := strings.NewReplacer(".", "_", ":", "_").Replace(ep.IP)
	return fmt.Sprintf("%s-%s-%d-%s", strings.ToLower(string(ep.Protocol)), ip, ep.Port, clusterTag(clusterSet, cluster))
}

// ServiceRecordID names a cluster's service record.
func ServiceRecordID(clusterSet, cluster string) string {
	return "clustermap-service-" + clusterTag(clusterSet, cluster)
}

// Attrs is one instance's attributes.
type Attrs = map[string]string

// AttrWriter is the writing installation, on the service record.
const AttrWriter = "CLUSTERMAP_WRITER"

// WriterMarkLength is a writer mark's length in hex characters.
const WriterMarkLength = 12

// WrittenByClustermap says a record names clustermap as its writer (the
// AWS Cloud Map MCS controller names itself there too).
func WrittenByClustermap(a Attrs) bool { return strings.HasPrefix(a[AttrController], "clustermap") }

// LimitError reports an export Cloud Map cannot hold.
type LimitError = registry.LimitError

// Encode renders an export as Cloud Map instances (id -> attributes) in
// record format version (RecordVersion, or an earlier one for version-skew
// tests), with one instance per endpoint address and port.
func Encode(e registry.Export, controller string, version int) (map[string]Attrs, error) {
	rec, err := ServiceRecord(e, controller, version)
	if err != nil {
		return nil, err
	}
	out := map[string]Attrs{ServiceRecordID(e.ClusterSet, e.Cluster): rec}
	for _, ep := range e.Endpoints {
		a := commonAttrs(e, controller)
		addr, err := netip.ParseAddr(ep.IP)
		if err != nil {
			return nil, fmt.Errorf("endpoint address %q: %w", ep.IP, err)
		}
		if addr.Is4() {
			a[AttrIPv4] = ep.IP
		} else {
			a[AttrIPv6] = ep.IP
		}
		a[AttrPort] = strconv.Itoa(int(ep.Port))
		a[AttrEndpointProtocol] = string(ep.Protocol)
		a[AttrReady] = strconv.FormatBool(ep.Ready)
		if ep.Serving && !ep.Ready {
			a[AttrServing] = "true" // a terminating pod still serving; ready implies serving
		}
		if ep.Terminating {
			a[AttrTerminating] = "true"
		}
		a[AttrServicePort] = strconv.Itoa(int(ep.ServicePort.Port))
		a[AttrServiceProtocol] = string(ep.ServicePort.Protocol)
		for k, v := range map[string]string{
			AttrEndpointPortName: ep.PortName, AttrHostname: ep.Hostname, AttrNodeName: ep.NodeName,
			AttrServicePortName: ep.ServicePort.Name, AttrServiceTargetPort: ep.TargetPort, AttrZone: ep.Zone,
		} {
			if v != "" {
				a[k] = v
			}
		}
		out[EndpointID(e.ClusterSet, e.Cluster, ep)] = a
	}
	if len(out) > MaxInstances {
		return nil, &LimitError{Reason: fmt.Sprintf("%d endpoint records and the service record exceed Cloud Map's quota of %d instances per service", len(out)-1, MaxInstances)}
	}
	return out, nil
}

// EncodePacked renders an export in the packed format (pack.go): the
// service record holds what endpoints fit beside it, chunks the rest.
// current are the cluster's instances as registered: an endpoint stays in
// the chunk it is in, so a change rewrites only the chunks it touches.
func EncodePacked(e registry.Export, controller string, current map[string]Attrs) (map[string]Attrs, error) {
	rec, err := ServiceRecord(e, controller, max(RecordVersion, PackedVersion))
	if err != nil {
		return nil, err
	}
	rec[AttrEndpointFormat] = PackedFormat
	es, err := entriesOf(e.Endpoints)
	if err != nil {
		return nil, err
	}
	chunkBase := Attrs{AttrClusterID: e.Cluster, AttrClusterSetID: e.ClusterSet, AttrRecord: chunkRecord, AttrController: controller}
	recID := ServiceRecordID(e.ClusterSet, e.Cluster)
	prev := map[string]int{}
	for id, a := range current {
		n := chunkIndex(id, e.ClusterSet, e.Cluster)
		if id == recID {
			n = 0
		}
		if p := joinParts(a); n >= 0 && p != "" {
			old, _, _ := unpackChunk(p, math.MaxInt) // its own: what does not read back is rewritten
			for _, x := range old {
				prev[x.key()] = n
			}
		}
	}
	chunks, err := planChunks(es, prev, func(n int) int {
		if n == 0 {
			return room(rec)
		}
		return room(chunkBase)
	})
	if err != nil {
		return nil, err
	}
	out := map[string]Attrs{recID: rec}
	for n, c := range chunks {
		if n == 0 {
			splitParts(rec, packChunk(c))
			continue
		}
		a := maps.Clone(chunkBase)
		splitParts(a, packChunk(c))
		out[ChunkID(e.ClusterSet, e.Cluster, n)] = a
	}
	if len(out) > MaxInstances {
		return nil, &LimitError{Reason: fmt.Sprintf("%d endpoint records and the service record exceed Cloud Map's quota of %d instances per service", len(out)-1, MaxInstances)}
	}
	return out, nil
}

func commonAttrs(e registry.Export, controller string) Attrs {
	return Attrs{
		AttrClusterID: e.Cluster, AttrClusterSetID: e.ClusterSet, AttrServiceType: string(e.Type),
		AttrExportCreationTime: strconv.FormatInt(e.Created.UnixMilli(), 10), AttrController: controller,
	}
}

// ServiceRecord renders what an export says beside its endpoints.
func ServiceRecord(e registry.Export, controller string, version int) (Attrs, error) {
	rec := commonAttrs(e, controller)
	rec[AttrRecord] = RecordValue
	if version >= 2 {
		rec[AttrRecordVersion] = strconv.Itoa(version)
	}
	ports, _ := json.Marshal(e.Ports)
	rec[AttrServicePorts] = string(ports)
	if e.SessionAffinity != "" {
		rec[AttrSessionAffinity] = string(e.SessionAffinity)
	}
	if c := e.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		rec[AttrSessionAffinityTime] = strconv.Itoa(int(*c.ClientIP.TimeoutSeconds))
	}
	if len(e.IPFamilies) > 0 {
		fams := make([]string, len(e.IPFamilies))
		for i, f := range e.IPFamilies {
			fams[i] = string(f)
		}
		rec[AttrIPFamilies] = strings.Join(fams, ",")
	}
	if e.InternalTrafficPolicy != nil {
		rec[AttrInternalTrafficPolicy] = string(*e.InternalTrafficPolicy)
	}
	if e.TrafficDistribution != nil {
		rec[AttrTrafficDistribution] = *e.TrafficDistribution
	}
	if len(e.Labels) > 0 {
		b, _ := json.Marshal(e.Labels)
		rec[AttrExportedLabels] = string(b)
	}
	if len(e.Annotations) > 0 {
		b, _ := json.Marshal(e.Annotations)
		rec[AttrExportedAnnotations] = string(b)
	}
	return rec, checkLimits(rec)
}

func checkLimits(a Attrs) error {
	total := registrationLength
	for k, v := range a {
		if len(v) > maxValueLength {
			return &LimitError{Reason: fmt.Sprintf("%s is %d characters; Cloud Map allows %d per attribute value (export fewer or shorter labels or annotations)", k, len(v), maxValueLength)}
		}
		total += len(k) + len(v)
	}
	if total > maxAttrsLength {
		return &LimitError{Reason: fmt.Sprintf("the service record's attributes total %d characters; Cloud Map allows %d (export fewer or shorter labels or annotations)", total, maxAttrsLength)}
	}
	return nil
}

// registrationLength and registrationAttrs are what is added to an
// instance's attributes as it is registered: the time (Unix ms, 13 digits)
// and, on the service record, the writer's mark.
const (
	registrationLength = len(AttrWritten) + 13 + len(AttrWriter) + WriterMarkLength
	registrationAttrs  = 2
)

// Instance is a Cloud Map instance as discovered.
type Instance struct {
	ID    string
	Attrs Attrs
}

// Decode groups a service's instances into exports, one per cluster. An
// instance without a cluster or clusterset id is not part of any export.
func Decode(key registry.Key, instances []Instance) []registry.Export {
	exports, _ := DecodeAt(key, instances, time.Now(), registry.DefaultMaxImportEndpoints)
	return exports
}

// Instances are the instances a plan of records (an instance id's
// attributes) reads back as.
func Instances(records map[string]Attrs) []Instance {
	in := make([]Instance, 0, len(records))
	for id, a := range records {
		in = append(in, Instance{ID: id, Attrs: a})
	}
	return in
}

// DecodeAt is Decode at a time; it also returns the records that make no
// export when no export is left to say them on: a cluster is exporting
// only by a record of its that is accepted
// (its service record or a chunk, whose ids must be its own, or an
// endpoint record that decodes), so that records of nothing (refused as
// not their cluster's, or as invalid) cannot keep an import alive, or win
// its conflicts. Each cluster's endpoint records are read up to
// maxEndpoints; past it, the export is cut there (Capped) and the rest
// not even decoded.
func DecodeAt(key registry.Key, instances []Instance, now time.Time, maxEndpoints int) ([]registry.Export, []registry.InvalidRecord) {
	byCluster := map[string]*registry.Export{}
	accepted := map[string]bool{}
	refused := map[string][]registry.InvalidRecord{}
	get := func(a Attrs) *registry.Export {
		c := a[AttrClusterID]
		e := byCluster[c]
		if e == nil {
			e = &registry.Export{ClusterSet: a[AttrClusterSetID], Cluster: c, Key: key, Foreign: true}
			byCluster[c] = e
		}
		return e
	}
	for _, in := range instances {
		a := in.Attrs
		cluster := a[AttrClusterID]
		if cluster == "" || a[AttrClusterSetID] == "" || len(validation.IsValidLabelValue(cluster)) > 0 {
			// No cluster this export could be told apart as (its id names
			// EndpointSlices and labels them): nobody's.
			continue
		}
		if errs := validation.IsDNS1123Label(cluster); len(errs) > 0 {
			// A cluster id is a DNS label (KEP-2149), lowercase: "Cluster-A"
			// and "cluster-a" would answer the same per-pod DNS names.
			refused[cluster] = append(refused[cluster], registry.InvalidRecord{ID: in.ID,
				Reason: fmt.Sprintf("cluster id %q is not a DNS-1123 label: %s", cluster, strings.Join(errs, "; "))})
			continue
		}
		if why := idMismatch(in.ID, a); why != "" {
			refused[cluster] = append(refused[cluster], registry.InvalidRecord{ID: in.ID, Reason: why})
			continue
		}
		packed := a[AttrRecord] == RecordValue || a[AttrRecord] == chunkRecord
		held := 0
		if e := byCluster[cluster]; e != nil {
			held = len(e.Endpoints)
		}
		var ep registry.Endpoint
		var eps []registry.Endpoint
		var bad []registry.InvalidRecord
		cut := false
		switch {
		case !packed && held >= maxEndpoints:
			byCluster[cluster].Capped = maxEndpoints
			continue
		case !packed:
			var err error
			if ep, err = decodeEndpoint(a); err != nil {
				refused[cluster] = append(refused[cluster], registry.InvalidRecord{ID: in.ID, Reason: err.Error()})
				continue
			}
		default:
			var err error
			eps, bad, cut, err = decodePacked(in, maxEndpoints-held)
			if err != nil {
				inv := registry.InvalidRecord{ID: in.ID, Reason: err.Error()}
				if a[AttrRecord] == chunkRecord {
					// A chunk that does not read makes no export: a
					// member's junk must not list its name among a
					// Service's exporters.
					refused[cluster] = append(refused[cluster], inv)
					continue
				}
				bad = append(bad, inv) // the service record still says the export
			}
		}
		e := get(a)
		accepted[cluster] = true
		if ms, err := strconv.ParseInt(a[AttrExportCreationTime], 10, 64); err == nil && (e.Created.IsZero() || time.UnixMilli(ms).Before(e.Created)) {
			e.Created = time.UnixMilli(ms)
		}
		if e.Type == "" || a[AttrRecord] == RecordValue {
			e.Type = mcsv1beta1.ServiceImportType(a[AttrServiceType])
		}
		if a[AttrRecord] == RecordValue {
			e.Writer = a[AttrWriter]
			if err := decodeRecord(e, a); err != nil {
				e.Invalid = append(e.Invalid, registry.InvalidRecord{ID: in.ID, Reason: err.Error()})
			}
		}
		if a[AttrRecord] == chunkRecord && e.RecordVersion == 0 {
			// A chunk read before its service record (they are written
			// at once) still says which format its writer reads: never
			// another controller's.
			e.RecordVersion = PackedVersion
		}
		if packed {
			e.Endpoints = append(e.Endpoints, eps...)
			e.Invalid = append(e.Invalid, bad...)
			if cut {
				e.Capped = maxEndpoints
			}
			continue
		}
		e.Endpoints = append(e.Endpoints, ep)
	}
	var orphans []registry.InvalidRecord
	for cluster, records := range refused {
		if accepted[cluster] {
			byCluster[cluster].Invalid = append(byCluster[cluster].Invalid, records...)
			continue
		}
		for _, r := range records {
			r.Cluster = cluster
			orphans = append(orphans, r)
		}
	}
	sort.Slice(orphans, func(i, j int) bool { return orphans[i].ID < orphans[j].ID })
	// Said on the first export, if any, naming the cluster they claim.
	if len(byCluster) > 0 && len(orphans) > 0 {
		first := slices.Min(slices.Collect(maps.Keys(byCluster)))
		byCluster[first].Invalid = append(byCluster[first].Invalid, orphans...)
		orphans = nil
	}
	out := make([]registry.Export, 0, len(byCluster))
	for _, e := range byCluster {
		if created, ok := saneCreation(e.Created, now); !ok {
			e.Invalid = append(e.Invalid, registry.InvalidRecord{ID: ServiceRecordID(e.ClusterSet, e.Cluster),
				Reason: fmt.Sprintf("%s %s is outside %s..now+%v: taken as now, the youngest export", AttrExportCreationTime, e.Created.UTC().Format(time.RFC3339), earliestExport.Format("2006-01-02"), creationSkew)})
			e.Created = created
		}
		if e.Foreign || e.Ports == nil {
			e.Ports = portsOf(e.Endpoints)
		}
		sort.Slice(e.Invalid, func(i, j int) bool { return e.Invalid[i].ID < e.Invalid[j].ID })
		e.Invalid = registry.CapInvalid(e.Invalid)
		e.Endpoints = dedupe(withAppProtocols(e.Endpoints, e.Ports))
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out, registry.CapInvalid(orphans)
}

// decodePacked reads the endpoints a service record or chunk packs, at
// most budget of them (cut says it stopped there), each checked as an
// endpoint record is: those that fail are bad, the first few of an
// instance each and the rest counted. err says the record does not read
// at all.
func decodePacked(in Instance, budget int) (eps []registry.Endpoint, bad []registry.InvalidRecord, cut bool, err error) {
	if in.Attrs[packedKeys[0]] == "" {
		return nil, nil, false, nil
	}
	if budget <= 0 {
		return nil, nil, true, nil // not even read
	}
	es, cut, err := unpackChunk(joinParts(in.Attrs), budget)
	if err != nil {
		return nil, nil, false, err
	}
	all := endpointsOf(es)
	out, n := all[:0], 0 // kept in place
	checked := names{}
	for _, ep := range all {
		if err := validEndpoint(ep, checked); err != nil {
			if n++; n <= registry.MaxInvalidRecords {
				bad = append(bad, registry.InvalidRecord{ID: in.ID + " " + ep.IP, Reason: err.Error()})
			}
			continue
		}
		out = append(out, ep)
	}
	if n > registry.MaxInvalidRecords {
		bad = append(bad, registry.InvalidRecord{ID: in.ID, Reason: fmt.Sprintf("%d more of its endpoints are invalid", n-registry.MaxInvalidRecords)})
	}
	return out, bad, cut, nil
}

// withAppProtocols gives endpoint records, which do not say it, their
// service port's appProtocol, as the service record does.
func withAppProtocols(eps []registry.Endpoint, ports []mcsv1beta1.ServicePort) []registry.Endpoint {
	for i, ep := range eps {
		for _, p := range ports {
			if ep.ServicePort.AppProtocol == nil && p.AppProtocol != nil && p.Name == ep.ServicePort.Name && p.Port == ep.ServicePort.Port && p.Protocol == ep.ServicePort.Protocol {
				eps[i].ServicePort.AppProtocol = ptr.To(*p.AppProtocol)
			}
		}
	}
	return eps
}

// dedupe sorts endpoints by address, port and protocol, keeping one of
// each: a cluster switching formats holds both for a while.
func dedupe(eps []registry.Endpoint) []registry.Endpoint {
	registry.SortEndpoints(eps)
	out := eps[:0]
	for i, ep := range eps {
		if i > 0 {
			last := out[len(out)-1]
			if last.IP == ep.IP && last.Port == ep.Port && last.Protocol == ep.Protocol {
				continue
			}
		}
		out = append(out, ep)
	}
	return out
}

// decodeRecord reads a service record; what does not decode is left out
// (ports then come from the endpoint records) and reported.
func decodeRecord(e *registry.Export, a Attrs) error {
	e.Foreign = false
	var errs []error
	e.RecordVersion = 1
	if v, ok := a[AttrRecordVersion]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			errs = append(errs, fmt.Errorf("%s %q is not a record format version", AttrRecordVersion, v))
		} else {
			e.RecordVersion = n
		}
		if n > RecordVersion {
			e.Newer = fmt.Sprintf("record format %d, newer than this release's %d", n, RecordVersion)
		}
	}
	if err := json.Unmarshal([]byte(a[AttrServicePorts]), &e.Ports); err != nil {
		e.Ports = nil
		errs = append(errs, fmt.Errorf("%s: %w", AttrServicePorts, err))
	}
	e.SessionAffinity = corev1.ServiceAffinity(a[AttrSessionAffinity])
	if v := a[AttrSessionAffinityTime]; v != "" {
		// Parsed wide: a value past int32 must not wrap into a valid one.
		if t, err := strconv.ParseInt(v, 10, 64); err != nil || t < 1 || t > maxAffinitySeconds {
			errs = append(errs, fmt.Errorf("%s %q is not within 1..%d seconds", AttrSessionAffinityTime, v, maxAffinitySeconds))
		} else {
			sec := int32(t)
			e.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
		}
	}
	if f := a[AttrIPFamilies]; f != "" {
		for _, fam := range strings.Split(f, ",") {
			e.IPFamilies = append(e.IPFamilies, corev1.IPFamily(fam))
		}
	}
	if v, ok := a[AttrInternalTrafficPolicy]; ok {
		p := corev1.ServiceInternalTrafficPolicy(v)
		e.InternalTrafficPolicy = &p
	}
	if v, ok := a[AttrTrafficDistribution]; ok {
		e.TrafficDistribution = &v
	}
	if v := a[AttrExportedLabels]; v != "" {
		if err := json.Unmarshal([]byte(v), &e.Labels); err != nil {
			e.Labels = nil
			errs = append(errs, fmt.Errorf("%s: %w", AttrExportedLabels, err))
		}
	}
	if v := a[AttrExportedAnnotations]; v != "" {
		if err := json.Unmarshal([]byte(v), &e.Annotations); err != nil {
			e.Annotations = nil
			errs = append(errs, fmt.Errorf("%s: %w", AttrExportedAnnotations, err))
		}
	}
	return errors.Join(append(errs, validateRecord(e))...)
}

// decodeEndpoint reads an endpoint record; one that Kubernetes would refuse
// in an EndpointSlice is an error, so that it cannot fail the others' write.
func decodeEndpoint(a Attrs) (registry.Endpoint, error) {
	ip, fam := a[AttrIPv4], AttrIPv4
	if ip == "" {
		ip, fam = a[AttrIPv6], AttrIPv6
	}
	if addr, err := netip.ParseAddr(ip); err != nil || addr.Is4() != (fam == AttrIPv4) {
		return registry.Endpoint{}, fmt.Errorf("%s %q is not a valid address", fam, ip)
	}
	port, err := strconv.Atoi(a[AttrPort])
	if err != nil || port < 1 || port > 65535 {
		return registry.Endpoint{}, fmt.Errorf("%s %q is not a port number", AttrPort, a[AttrPort])
	}
	svcPort := 0
	if v := a[AttrServicePort]; v != "" {
		if svcPort, err = strconv.Atoi(v); err != nil || svcPort < 1 || svcPort > 65535 {
			return registry.Endpoint{}, fmt.Errorf("%s %q is not a port number", AttrServicePort, v)
		}
	}
	proto := corev1.Protocol(a[AttrEndpointProtocol])
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	svcProto := corev1.Protocol(a[AttrServiceProtocol])
	if svcProto == "" {
		svcProto = proto
	}
	ready := a[AttrReady] != "false"
	ep := registry.Endpoint{
		IP: ip, Port: int32(port), PortName: a[AttrEndpointPortName], Protocol: proto,
		Ready: ready, Terminating: a[AttrTerminating] == "true",
		Hostname: a[AttrHostname], NodeName: a[AttrNodeName], Zone: a[AttrZone],
		ServicePort: mcsv1beta1.ServicePort{Name: a[AttrServicePortName], Protocol: svcProto, Port: int32(svcPort)},
		TargetPort:  a[AttrServiceTargetPort],
	}
	ep.Serving = ready || a[AttrServing] == "true"
	return ep, validEndpoint(ep, nil)
}

// validEndpoint says why Kubernetes would refuse an endpoint in an
// EndpointSlice, or why no pod has its address; nil when neither. n
// remembers the names already checked, or is nil.
func validEndpoint(ep registry.Endpoint, n names) error {
	addr, err := netip.ParseAddr(ep.IP)
	if err != nil || addr.Zone() != "" || addr.Is4In6() {
		return fmt.Errorf("address %q is not a valid address", ep.IP)
	}
	if why := specialAddress(addr); why != "" {
		return fmt.Errorf("address %q is a %s address, no pod's", ep.IP, why)
	}
	if ep.Port < 1 || ep.Port > 65535 {
		return fmt.Errorf("port %d is not a port number", ep.Port)
	}
	if p := ep.ServicePort.Port; p < 0 || p > 65535 {
		return fmt.Errorf("service port %d is not a port number", p)
	}
	for _, p := range []corev1.Protocol{ep.Protocol, ep.ServicePort.Protocol} {
		if err := validProtocol(p); err != nil {
			return err
		}
	}
	ap := ep.ServicePort.AppProtocol
	for _, c := range [...]nameCheck{
		{AttrHostname, ep.Hostname, ep.Hostname != "", validation.IsDNS1123Label},
		{AttrEndpointPortName, ep.PortName, ep.PortName != "", validation.IsDNS1123Label},
		{AttrServicePortName, ep.ServicePort.Name, ep.ServicePort.Name != "", validation.IsDNS1123Label},
		{AttrNodeName, ep.NodeName, ep.NodeName != "", validation.IsDNS1123Subdomain},
		{AttrZone, ep.Zone, ep.Zone != "", validation.IsValidLabelValue},
		{"appProtocol", ptr.Deref(ap, ""), ap != nil, validation.IsQualifiedName}, // set, even empty, it must be a name
	} {
		if !c.set {
			continue
		}
		if err := n.check(c.attr, c.value, c.valid); err != nil {
			return err
		}
	}
	return nil
}

// nameCheck is a name of an endpoint's and how Kubernetes checks it.
type nameCheck struct {
	attr, value string
	set         bool // unset names are not checked
	valid       func(string) []string
}

// names remembers the verdicts on the names the endpoints of one record
// repeat (node, zone, port names): Kubernetes checks them with regular
// expressions, and an importer decoding every endpoint of large Services
// spent a third of its time in them (BenchmarkFleet's CPU profile, 50 x
// 100). Bounded, for records of distinct names (hostnames).
type names map[[2]string]error

const maxNames = 256

func (n names) check(attr, value string, valid func(string) []string) error {
	key := [2]string{attr, value}
	if err, ok := n[key]; ok {
		return err
	}
	var err error
	if errs := valid(value); len(errs) > 0 {
		err = fmt.Errorf("%s %q: %s", attr, value, strings.Join(errs, "; "))
	}
	if n != nil && len(n) < maxNames {
		n[key] = err
	}
	return err
}

// portsOf derives service ports from endpoint records, for exports written
// without a service record.
func portsOf(eps []registry.Endpoint) []mcsv1beta1.ServicePort {
	seen := map[mcsv1beta1.ServicePort]bool{}
	var ports []mcsv1beta1.ServicePort
	for _, ep := range eps {
		p := ep.ServicePort
		if p.Port == 0 || seen[p] {
			continue
		}
		seen[p] = true
		ports = append(ports, p)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i].Port < ports[j].Port })
	return ports
}

// Diff compares what a cluster should have registered with what it has
// (every instance found is its own): instances to (re-)register, and ids
// to deregister. Only clustermap's attributes are compared, so attributes
// added by others cause no churn.
func Diff(desired, current map[string]Attrs) diff.Changes {
	return diff.Instances(desired, current, nil, sameOurs)
}

func sameOurs(a, b Attrs) bool {
	for _, k := range ourKeys {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

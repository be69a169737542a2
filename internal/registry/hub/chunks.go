package hub

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/registry"
)

// The plan of a write and the reading of what is held: pure functions
// between a registry.Export and the ClusterExport chunks that hold it.

// objectName is a chunk's name: the hub's CRD refuses any other, so two
// members cannot hold one name.
func objectName(cluster string, key registry.Key, chunk int) string {
	return key.Namespace + "." + key.Name + "." + cluster + "." + strconv.Itoa(chunk)
}

// chunks are the objects that hold e, in the hub namespace ns: the head
// (chunk 0, with the Service's fields) first. Endpoints go to chunks by
// a hash of their address, so a pod's change rewrites its chunk and the
// head, not the whole export. Each chunk carries the digest of what it
// holds, and the head the digest of the whole and of each other chunk:
// an unchanged chunk plans no write, and a reader can tell chunks of one
// write from another's. An export of more than MaxChunks chunks is
// refused whole.
func chunks(ns string, e registry.Export) ([]*hubv1alpha1.ClusterExport, error) {
	if most := hubv1alpha1.MaxChunks * hubv1alpha1.MaxChunkEndpoints; len(e.Endpoints) > most {
		return nil, &registry.LimitError{Reason: fmt.Sprintf("%s has %d endpoints: the hub holds at most %d a cluster and Service",
			e.Key, len(e.Endpoints), most)}
	}
	eps := make([]hubv1alpha1.Endpoint, len(e.Endpoints))
	sorted := slices.Clone(e.Endpoints)
	registry.SortEndpoints(sorted)
	for i, ep := range sorted {
		eps[i] = hubv1alpha1.Endpoint{IP: ep.IP, Port: ep.Port, PortName: ep.PortName, Protocol: ep.Protocol, Ready: ep.Ready, Serving: ep.Serving,
			Terminating: ep.Terminating, Hostname: ep.Hostname, NodeName: ep.NodeName, Zone: ep.Zone, ServicePort: ep.ServicePort, TargetPort: ep.TargetPort}
	}
	parts := partition(eps)
	n := len(parts)
	out := make([]*hubv1alpha1.ClusterExport, n)
	for i := range out {
		spec := hubv1alpha1.ClusterExportSpec{Cluster: e.Cluster, Service: hubv1alpha1.ServiceRef{Namespace: e.Namespace, Name: e.Name},
			Chunk: int32(i), Chunks: int32(n), Endpoints: parts[i]}
		out[i] = &hubv1alpha1.ClusterExport{
			TypeMeta: metav1.TypeMeta{APIVersion: hubv1alpha1.GroupVersion.String(), Kind: "ClusterExport"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: objectName(e.Cluster, e.Key, i), Labels: map[string]string{
				hubv1alpha1.ClusterLabel: e.Cluster, hubv1alpha1.ServiceNamespaceLabel: e.Namespace, hubv1alpha1.ServiceNameLabel: e.Name}},
			Spec: spec,
		}
	}
	head := &out[0].Spec
	head.Created = ptr.To(metav1.NewMicroTime(e.Created))
	head.Type, head.Ports, head.SessionAffinity, head.SessionAffinityConfig = e.Type, e.Ports, e.SessionAffinity, e.SessionAffinityConfig
	head.IPFamilies, head.InternalTrafficPolicy, head.TrafficDistribution = e.IPFamilies, e.InternalTrafficPolicy, e.TrafficDistribution
	head.Labels, head.Annotations = e.Labels, e.Annotations
	for _, o := range out[1:] {
		o.Spec.Revision = digest(o.Spec)
		head.ChunkRevisions = append(head.ChunkRevisions, o.Spec.Revision)
	}
	head.Revision = digest(*head)
	return out, nil
}

// partition spreads endpoints (sorted) over chunks by a hash of their
// address, at about three quarters of a chunk's room so that the count
// holds while a Service scales a little; more chunks while one overflows.
// An export too large for that within MaxChunks is cut in order instead
// (any change then moves most endpoints).
func partition(eps []hubv1alpha1.Endpoint) [][]hubv1alpha1.Endpoint {
	room := hubv1alpha1.MaxChunkEndpoints
	hashes := make([]uint32, len(eps))
	for i, ep := range eps {
		h := fnv.New32a()
		h.Write([]byte(ep.IP))
		hashes[i] = h.Sum32()
	}
	for n := max(1, (4*len(eps)+3*room-1)/(3*room)); n <= hubv1alpha1.MaxChunks; n++ {
		parts := make([][]hubv1alpha1.Endpoint, n)
		fits := true
		for i, ep := range eps {
			c := hashes[i] % uint32(n)
			parts[c] = append(parts[c], ep)
			fits = fits && len(parts[c]) <= room
		}
		if fits {
			return parts
		}
	}
	n := (len(eps) + room - 1) / room
	parts := make([][]hubv1alpha1.Endpoint, n)
	for i := range parts {
		parts[i] = eps[i*len(eps)/n : (i+1)*len(eps)/n]
	}
	return parts
}

// digest is a chunk's revision: of its spec, itself left out.
func digest(spec hubv1alpha1.ClusterExportSpec) string {
	spec.Revision = ""
	b, _ := json.Marshal(spec) // plain data: cannot fail
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:20]
}

// assemble reads one cluster's export from the chunks the hub holds of
// it: whole only when every chunk carries the revision the head names
// for it (else false: a write is under way, keep what was read before).
// No more than MaxChunks are read, whatever the head says.
func assemble(set string, objs []*hubv1alpha1.ClusterExport) (registry.Export, bool) {
	byChunk := map[int32]*hubv1alpha1.ClusterExport{}
	for _, o := range objs {
		byChunk[o.Spec.Chunk] = o
	}
	head := byChunk[0]
	if head == nil || head.Spec.Chunks < 1 || head.Spec.Chunks > hubv1alpha1.MaxChunks {
		return registry.Export{}, false
	}
	s := head.Spec
	e := registry.Export{ClusterSet: set, Cluster: s.Cluster, Key: registry.Key{Namespace: s.Service.Namespace, Name: s.Service.Name},
		Type: s.Type, Ports: s.Ports, SessionAffinity: s.SessionAffinity, SessionAffinityConfig: s.SessionAffinityConfig, IPFamilies: s.IPFamilies,
		InternalTrafficPolicy: s.InternalTrafficPolicy, TrafficDistribution: s.TrafficDistribution, Labels: s.Labels, Annotations: s.Annotations,
	}
	if s.Created != nil {
		e.Created = s.Created.Time
	}
	if len(s.ChunkRevisions) != int(s.Chunks)-1 {
		return registry.Export{}, false
	}
	for i := range s.Chunks {
		c := byChunk[i]
		if c == nil || i > 0 && c.Spec.Revision != s.ChunkRevisions[i-1] || c.Spec.Chunks != s.Chunks || c.Spec.Cluster != s.Cluster {
			return registry.Export{}, false
		}
		for _, ep := range c.Spec.Endpoints {
			e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: ep.IP, Port: ep.Port, PortName: ep.PortName, Protocol: ep.Protocol, Ready: ep.Ready,
				Serving: ep.Serving, Terminating: ep.Terminating, Hostname: ep.Hostname, NodeName: ep.NodeName, Zone: ep.Zone, ServicePort: ep.ServicePort, TargetPort: ep.TargetPort})
		}
	}
	return e, true
}

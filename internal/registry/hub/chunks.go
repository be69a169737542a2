package hub

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
// (chunk 0, with the Service's fields) first. Each carries the revision,
// a digest of the whole export, so an unchanged export plans no write and
// a reader can tell chunks of one write from another's. An export of more
// than MaxChunks chunks is refused whole.
func chunks(ns string, e registry.Export) ([]*hubv1alpha1.ClusterExport, error) {
	n := max(1, (len(e.Endpoints)+hubv1alpha1.MaxChunkEndpoints-1)/hubv1alpha1.MaxChunkEndpoints)
	if n > hubv1alpha1.MaxChunks {
		return nil, &registry.LimitError{Reason: fmt.Sprintf("%s has %d endpoints: the hub holds at most %d a cluster and Service",
			e.Key, len(e.Endpoints), hubv1alpha1.MaxChunks*hubv1alpha1.MaxChunkEndpoints)}
	}
	eps := make([]hubv1alpha1.Endpoint, len(e.Endpoints))
	sorted := slices.Clone(e.Endpoints)
	registry.SortEndpoints(sorted)
	for i, ep := range sorted {
		eps[i] = hubv1alpha1.Endpoint{IP: ep.IP, Port: ep.Port, PortName: ep.PortName, Protocol: ep.Protocol, Ready: ep.Ready, Serving: ep.Serving,
			Terminating: ep.Terminating, Hostname: ep.Hostname, NodeName: ep.NodeName, Zone: ep.Zone, ServicePort: ep.ServicePort, TargetPort: ep.TargetPort}
	}
	out := make([]*hubv1alpha1.ClusterExport, n)
	for i := range out {
		spec := hubv1alpha1.ClusterExportSpec{Cluster: e.Cluster, Service: hubv1alpha1.ServiceRef{Namespace: e.Namespace, Name: e.Name},
			Chunk: int32(i), Chunks: int32(n), Endpoints: eps[i*len(eps)/n : (i+1)*len(eps)/n]}
		if i == 0 {
			spec.Created = ptr.To(metav1.NewMicroTime(e.Created))
			spec.Type, spec.Ports, spec.SessionAffinity, spec.SessionAffinityConfig = e.Type, e.Ports, e.SessionAffinity, e.SessionAffinityConfig
			spec.IPFamilies, spec.InternalTrafficPolicy, spec.TrafficDistribution = e.IPFamilies, e.InternalTrafficPolicy, e.TrafficDistribution
			spec.Labels, spec.Annotations = e.Labels, e.Annotations
		}
		out[i] = &hubv1alpha1.ClusterExport{
			TypeMeta: metav1.TypeMeta{APIVersion: hubv1alpha1.GroupVersion.String(), Kind: "ClusterExport"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: objectName(e.Cluster, e.Key, i), Labels: map[string]string{
				hubv1alpha1.ClusterLabel: e.Cluster, hubv1alpha1.ServiceNamespaceLabel: e.Namespace, hubv1alpha1.ServiceNameLabel: e.Name}},
			Spec: spec,
		}
	}
	rev := revision(out)
	for _, o := range out {
		o.Spec.Revision = rev
	}
	return out, nil
}

func revision(objs []*hubv1alpha1.ClusterExport) string {
	h := sha256.New()
	for _, o := range objs {
		b, _ := json.Marshal(o.Spec) // plain data: cannot fail
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:20]
}

// assemble reads one cluster's export from the chunks the hub holds of
// it: whole only when the head and every chunk it names carry one
// revision (else false: a write is under way, keep what was read
// before). No more than MaxChunks are read, whatever the head says.
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
	for i := range s.Chunks {
		c := byChunk[i]
		if c == nil || c.Spec.Revision != s.Revision || c.Spec.Chunks != s.Chunks || c.Spec.Cluster != s.Cluster {
			return registry.Export{}, false
		}
		for _, ep := range c.Spec.Endpoints {
			e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: ep.IP, Port: ep.Port, PortName: ep.PortName, Protocol: ep.Protocol, Ready: ep.Ready,
				Serving: ep.Serving, Terminating: ep.Terminating, Hostname: ep.Hostname, NodeName: ep.NodeName, Zone: ep.Zone, ServicePort: ep.ServicePort, TargetPort: ep.TargetPort})
		}
	}
	return e, true
}

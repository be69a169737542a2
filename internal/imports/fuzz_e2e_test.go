//go:build e2e

package imports_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/merge"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// Whatever the clusterset's members wrote, an import's objects pass the
// Kubernetes API's validation: any records go through decode, merge and
// plan as in the controller, and every object planned is created, dry run,
// in a real kube-apiserver, which must accept it. (Decoding refuses what
// it must; this holds what it lets through, and what merging makes of
// several clusters' exports, to the API's own rules.) The seeds run in
// make test; make fuzz explores from them.
func FuzzPlannedObjectsAreValid(f *testing.F) {
	for _, seed := range plannedSeeds(f) {
		f.Add(seed)
	}
	env := harness.Clusters(f, 1)
	cl := harness.Client(f, env.Clusters[0].Config)
	ctx := context.Background()
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fuzz"}}); err != nil {
		f.Fatal(err)
	}
	key := registry.Key{Namespace: "fuzz", Name: "svc"}
	f.Fuzz(func(t *testing.T, data []byte) {
		var records map[string]recordfmt.Attrs
		if json.Unmarshal(data, &records) != nil {
			return
		}
		var in []recordfmt.Instance
		for id, a := range records {
			in = append(in, recordfmt.Instance{ID: id, Attrs: a})
		}
		exports := recordfmt.Decode(key, in)
		if len(exports) == 0 {
			return
		}
		d := imports.Plan(key, merge.Merge(exports), nil)
		objs := []client.Object{d.Import}
		if d.Service != nil {
			objs = append(objs, d.Service)
		}
		for _, s := range d.Slices {
			objs = append(objs, s)
		}
		for _, o := range objs {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := cl.Create(ctx, o.DeepCopyObject().(client.Object), client.DryRunAll)
			cancel()
			if err != nil {
				t.Errorf("the API refuses a planned %T %s: %v", o, o.GetName(), err)
			}
		}
	})
}

// plannedSeeds are two clusters' records in both formats: several ports
// (one with an appProtocol, one UDP), dual-stack, hostnames and zones,
// endpoints not ready, session affinity; and the two clusters disagreeing
// on a port.
func plannedSeeds(f *testing.F) [][]byte {
	key := registry.Key{Namespace: "fuzz", Name: "svc"}
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, AppProtocol: ptr.To("http")}
	dns := mcsv1beta1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}
	export := func(cluster string, ports []mcsv1beta1.ServicePort, ips ...string) registry.Export {
		e := registry.Export{ClusterSet: "set", Cluster: cluster, Key: key, Type: mcsv1beta1.ClusterSetIP, Ports: ports,
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, Created: time.UnixMilli(1700000000000),
			SessionAffinity: corev1.ServiceAffinityClientIP, SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}}
		for i, ip := range ips {
			for _, p := range ports {
				e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: ip, Port: p.Port + 8000, PortName: p.Name, Protocol: p.Protocol,
					Ready: i%2 == 0, Serving: true, Hostname: "pod-" + string(rune('a'+i)), NodeName: "node-1", Zone: "use1-az1", ServicePort: p, TargetPort: p.Name})
			}
		}
		return e
	}
	var seeds [][]byte
	add := func(exports ...registry.Export) {
		records := map[string]recordfmt.Attrs{}
		for i, e := range exports {
			var enc map[string]recordfmt.Attrs
			var err error
			if i%2 == 0 {
				enc, err = recordfmt.EncodePacked(e, "seed", nil)
			} else {
				enc, err = recordfmt.Encode(e, "seed", recordfmt.RecordVersion)
			}
			if err != nil {
				f.Fatal(err)
			}
			maps.Copy(records, enc)
		}
		b, err := json.Marshal(records)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	add(export("east", []mcsv1beta1.ServicePort{http, dns}, "10.1.0.1", "10.1.0.2", "fd00:1::1"))
	add(export("east", []mcsv1beta1.ServicePort{http, dns}, "10.1.0.1"), export("west", []mcsv1beta1.ServicePort{http}, "10.2.0.1", "fd00:2::1"))
	other := http
	other.Port = 8080
	add(export("east", []mcsv1beta1.ServicePort{http}, "10.1.0.1"), export("west", []mcsv1beta1.ServicePort{other}, "10.2.0.1"))
	unnamed := mcsv1beta1.ServicePort{Protocol: corev1.ProtocolTCP, Port: 81}
	add(export("east", []mcsv1beta1.ServicePort{unnamed}, "10.1.0.1"), export("west", []mcsv1beta1.ServicePort{http}, "10.2.0.1"))
	return seeds
}

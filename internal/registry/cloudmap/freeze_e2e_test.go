//go:build e2e

package cloudmap_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// One cluster writing an older record format anywhere turns every other
// to per-endpoint records; an export of 2,000 endpoints does not fit
// those (Cloud Map's 1,000 instances per service) and was refused on each
// publish, so its pod changes froze in every importer. It stays packed,
// says so, and its changes keep arriving.
func TestLargeExportOutlivesAnOldFormat(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
	var mu sync.Mutex
	var kept []string
	formats := map[string]*recordfmt.Formats{}
	packing := func(cluster string) func(*cloudmap.Options) {
		formats[cluster] = &recordfmt.Formats{Cluster: cluster}
		return func(o *cloudmap.Options) {
			o.Formats, o.Usage = formats[cluster], cloudmap.NewUsage(0)
			obs := o.Observer.(registry.ObserverFuncs)
			obs.OnKeptPacked = func(key registry.Key, msg string) {
				mu.Lock()
				defer mu.Unlock()
				kept = append(kept, key.String()+": "+msg)
			}
			o.Observer = obs
		}
	}
	east := newClusterWith(t, ctx, srv, "AKIDEAST", "", "", "east", packing("east"))
	west := newClusterWith(t, ctx, srv, "AKIDWEST", "", "", "west", packing("west"))
	http := mcsv1beta1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}
	big := bigExport("east", 2000, http)
	waitUntil(t, "east's export of 2,000 endpoints", func() bool { return publish(ctx, east.b, big) == nil })
	waitUntil(t, "west imports it", func() bool { return len(west.ips(big.Key)) == 2000 })

	// An older release's cluster exports elsewhere.
	old := newClusterWith(t, ctx, srv, "AKIDOLD", "", "", "old", func(o *cloudmap.Options) { o.RecordVersion = 2 })
	if err := publish(ctx, old.b, export("old", registry.Key{Namespace: "apps", Name: "junk"}, "10.9.0.1")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "east chooses per-endpoint records", func() bool {
		c := formats["east"].Choose()
		return c.Known && !c.Packed
	})
	for i := range 3 {
		big.Endpoints[i].IP = fmt.Sprintf("10.7.0.%d", i+1)
		if err := publish(ctx, east.b, big); err != nil {
			t.Fatalf("change %d of the large export: %v", i, err)
		}
		want := big.Endpoints[i].IP
		waitUntil(t, "west imports "+want, func() bool { return slices.Contains(west.ips(big.Key), want) })
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kept) == 0 || !strings.Contains(kept[0], "old") {
		t.Errorf("kept packed said %q; want it naming cluster old", kept)
	}
}

// bigExport is cluster's export of ns/big: n ready endpoints of port.
func bigExport(cluster string, n int, port mcsv1beta1.ServicePort) registry.Export {
	e := registry.Export{ClusterSet: "set", Cluster: cluster, Key: registry.Key{Namespace: "ns", Name: "big"},
		Type: mcsv1beta1.ClusterSetIP, Ports: []mcsv1beta1.ServicePort{port}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}
	for i := range n {
		e.Endpoints = append(e.Endpoints, registry.Endpoint{IP: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), Port: 8080, PortName: port.Name,
			Protocol: port.Protocol, Ready: true, Serving: true, ServicePort: port})
	}
	return e
}

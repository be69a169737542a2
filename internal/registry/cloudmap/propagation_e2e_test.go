//go:build e2e

package cloudmap_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
)

// An importer measures each registration of another cluster from the time
// the exporter wrote into the record, once per registration; its own
// registrations and the exports it finds at start measure nothing.
func TestPropagationIsMeasuredFromTheExportersWrite(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: noLateFailures()})
	backend := func(cluster string, onPropagation func(time.Duration)) *cloudmap.Backend {
		c := srv.Client(t, srv.Shipped())
		return cloudmap.New(c, cloudmap.Options{ClusterSet: "set", Cluster: cluster, Controller: "test", Log: logr.Discard(), Observer: registry.ObserverFuncs{OnPropagated: onPropagation}})
	}
	web, api2 := registry.Key{Namespace: "demo", Name: "web"}, registry.Key{Namespace: "demo", Name: "api"}
	var mu sync.Mutex
	var took []time.Duration
	exporter, importer := backend("c1", nil), backend("c2", func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		took = append(took, d)
	})
	// Before the importer starts: found at start, not measured.
	if err := publish(ctx, exporter, export("c1", api2, "10.0.0.9")); err != nil {
		t.Fatal(err)
	}
	if err := publish(ctx, importer, export("c2", web, "10.0.1.1")); err != nil { // its own: never measured
		t.Fatal(err)
	}
	heard := make(chan registry.Key, 100)
	go func() {
		_ = importer.Watch(ctx, registry.SinkFuncs{OnSet: func(key registry.Key, _ []registry.Export) { heard <- key }})
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(took)
	}
	waitUntil(t, "the importer reads both services", func() bool { return len(heard) >= 2 })
	if n := count(); n != 0 {
		t.Fatalf("exports found at start measured %d times", n)
	}
	start := time.Now()
	if err := publish(ctx, exporter, export("c1", web, "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	// The service record and the endpoint, at least once each (a write
	// while an earlier one of the record still ran is written again, and
	// measured again).
	waitUntil(t, "the new export measured", func() bool { return count() >= 2 })
	mu.Lock()
	for _, d := range took {
		if d < 0 || d > time.Since(start) {
			t.Errorf("propagation %v, want within the %v since the write", d, time.Since(start))
		}
	}
	mu.Unlock()
	time.Sleep(6 * time.Second) // the reads of the change done
	n := count()
	time.Sleep(3 * time.Second) // more polls: nothing new, nothing measured
	if m := count(); m != n {
		t.Errorf("%d measurements, then %d: an unchanged record is not measured again", n, m)
	}
}

//go:build e2e

package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
)

// drainBound is the longest a cluster that dies whole may stay in another
// cluster's path: the TTL, counted from the importer's last read of its
// record (which trails its last write by the slowest operation, the read
// lag and a proof read interval), and up to a heartbeat more for the
// others' records, against which its silence is measured, to move.
func (m model) drainBound() time.Duration {
	return m.watch.SilentAfter + cloudmap.MinHeartbeat + m.profile.OperationTime.Max + m.profile.ReadLag + m.watch.ProofReadInterval + slack
}

func (m model) drainWhy() string {
	return fmt.Sprintf("TTL %v + heartbeat %v + operation <= %v + read lag %v + proof read %v + %v",
		m.watch.SilentAfter, cloudmap.MinHeartbeat, m.profile.OperationTime.Max, m.profile.ReadLag, m.watch.ProofReadInterval, slack)
}

// BenchmarkDrain: a cluster that dies whole (its controller gone: nothing
// more is written) leaves the others' path. 10 clusters in one account,
// each the controller's registry side at the shipped settings (its own
// client at the shipped budgets, the shipped liveness: a 30 s heartbeat,
// a 2-minute TTL, proofs read every 10 s), against one emulator under the
// AWS profile, each exporting one Service. Four stop at moments spread
// over a heartbeat, each timed to the moment the last of the others left
// drained it; in two rounds. It prints p50 and p99 against drainBound.
// CLUSTERMAP_DRAIN_CLUSTERS sets the clusterset's size (the fleet's 50,
// say): more clusters poll and beat in the one account.
func BenchmarkDrain(b *testing.B) {
	m := shipped()
	const stopped, rounds = 4, 2
	clusters := 10
	if v := os.Getenv("CLUSTERMAP_DRAIN_CLUSTERS"); v != "" {
		var err error
		if clusters, err = strconv.Atoi(v); err != nil || clusters <= stopped+1 {
			b.Fatalf("CLUSTERMAP_DRAIN_CLUSTERS=%q: want more than %d clusters", v, stopped+1)
		}
	}
	var took []time.Duration
	for round := range rounds {
		took = append(took, drainRound(b, m, fmt.Sprintf("drain-%d", round), clusters, stopped)...)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	fmt.Printf("Drain at the shipped defaults, %d clusters in one account, %d of them stopping in each of %d rounds, one emulator under the %s profile:\n",
		clusters, stopped, rounds, m.profile.Name)
	fmt.Printf("  a dead cluster drained by every other: p50 %v, each %v\n", percentile(took, 50).Round(100*time.Millisecond), roundAll(took))
	within(b, "  ... p99", percentile(took, 99), m.drainBound(), m.drainWhy())
	b.ReportMetric(percentile(took, 99).Seconds(), "drain-p99-s")
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}

// drainRound runs clusters of clusterset set until each proves alive to
// every other, stops the first stopped ones a heartbeat's share apart,
// and returns how long after its stop each was drained by the last of
// the others.
func drainRound(b *testing.B, m model, set string, clusters, stopped int) []time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := cloudmaptest.Start(b, cloudmaplocal.Options{Profile: &m.profile})
	type member struct {
		b       *cloudmap.Backend
		stop    context.CancelFunc
		mu      sync.Mutex
		proofs  int
		drained map[string]time.Time
	}
	var ms []*member
	s := shape(b)
	s.clusters, s.services, s.namespaces = clusters, 1, 1
	for c := range clusters {
		mctx, stop := context.WithCancel(ctx)
		mb := &member{stop: stop, drained: map[string]time.Time{}}
		name := fmt.Sprintf("cluster-%02d", c)
		mb.b = cloudmap.New(srv.Client(b, srv.Shipped()), cloudmap.Options{ClusterSet: set, Cluster: name, Controller: "clustermap bench", Log: benchLog(name),
			Observer: registry.ObserverFuncs{OnProofs: func(p map[string]time.Time, _ map[string]bool) {
				mb.mu.Lock()
				mb.proofs = len(p)
				mb.mu.Unlock()
			},
				OnSilent: func(cluster string, _ time.Time, silent bool) {
					mb.mu.Lock()
					defer mb.mu.Unlock()
					if _, ok := mb.drained[cluster]; silent && !ok {
						mb.drained[cluster] = time.Now()
					}
				}}})
		go func() { _ = mb.b.Watch(mctx, registry.SinkFuncs{}) }()
		e := s.export(c, 3, 0) // a small service (the shape's first three have 2,000 pods)
		e.ClusterSet = set
		if err := publishRetrying(ctx, mb.b.Publish, e); err != nil {
			b.Fatal(err)
		}
		ms = append(ms, mb)
	}
	waitAll(b, "every cluster's proof read by every other", 5*time.Minute, func() bool {
		for _, mb := range ms {
			mb.mu.Lock()
			n := mb.proofs
			mb.mu.Unlock()
			if n < clusters {
				return false
			}
		}
		return true
	})
	// A heartbeat more: each record moved once since it was first read.
	time.Sleep(cloudmap.MinHeartbeat)

	at := make([]time.Time, stopped)
	for i := range stopped {
		time.Sleep(cloudmap.MinHeartbeat / time.Duration(stopped))
		ms[i].stop()
		at[i] = time.Now()
	}
	var took []time.Duration
	for i := range stopped {
		name := fmt.Sprintf("cluster-%02d", i)
		var last time.Time
		waitAll(b, name+" drained by every cluster left", 2*m.drainBound(), func() bool {
			for _, mb := range ms[stopped:] {
				mb.mu.Lock()
				t, ok := mb.drained[name]
				mb.mu.Unlock()
				if !ok {
					return false
				}
				last = maxTime(last, t)
			}
			return true
		})
		took = append(took, last.Sub(at[i]))
	}
	return took
}

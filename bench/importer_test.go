//go:build e2e

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// BenchmarkImporter: the real controller (controller.Run at the shipped
// defaults, writing to a kwok cluster's apiserver) imports the fleet
// (shape: 49 other clusters x 1,000 services) from one emulator under the
// AWS profile. The 49 clusters' records are written by their registry
// sides (cloudmap.Backend, packed records, as their controllers write
// them), which do not watch: the process's CPU is the importer's, the
// emulator's and the tracker's. The importing cluster exports nothing.
// It prints the time to import everything, then pod changes, each after
// a quiet spell past the fast polls, timed from the write to the
// importing cluster's EndpointSlices, against changeBound; and the
// process's CPU per change and while idle. The importer's decode cache is
// on, as shipped: a change in one cluster decodes that cluster's records.
//
// Setting up 49,000 exports is bound by the account's quotas (50/s per
// operation in the profile): about 18 minutes, measured (docs/scale.md);
// CLUSTERMAP_FLEET=20,250 sets up in about 2.
func BenchmarkImporter(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := shape(b)
	m := shipped()
	changes := 20
	if v := os.Getenv("CLUSTERMAP_BENCH_CHANGES"); v != "" {
		changes, _ = strconv.Atoi(v)
	}
	env := harness.ClustersWith(b, devenv.Options{Clusters: 1, ClusterSet: fleetClusterSet})
	cm := harness.CloudMap(b, cloudmaplocal.Options{Profile: &m.profile})
	cl := harness.Client(b, env.Clusters[0].Config)
	// Imports go to namespaces that exist (namespace sameness).
	for n := range s.namespaces {
		if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%02d", n)}}); err != nil {
			b.Fatal(err)
		}
	}

	// The other clusters write their records: one client for all (an
	// account's quota binds them together, not their budgets), at most
	// 16 publishes at once. The setup's own rate, not a controller's.
	wc := cloudmaptest.ClientOf(b, cm.URL, cloudmapclient.Options{QPS: 150, Burst: 150})
	writers := make([]*cloudmap.Backend, s.clusters)
	// failedLate are the writes Cloud Map accepted and then failed, as the
	// writers hear of them once they confirm their writes (changes only).
	var failedMu sync.Mutex
	failedLate := map[string]bool{}
	for c := 1; c < s.clusters; c++ {
		name := fmt.Sprintf("cluster-%02d", c)
		formats := &recordfmt.Formats{Cluster: name}
		formats.Tap(registry.SinkFuncs{}).Synced() // written packed, as in a fleet of this release
		writers[c] = cloudmap.New(wc, cloudmap.Options{ClusterSet: fleetClusterSet, Cluster: name, Controller: "clustermap bench", Log: logr.Discard(), Formats: formats, Usage: cloudmap.NewUsage(0),
			Observer: registry.ObserverFuncs{OnWriteFailed: func(key registry.Key) {
				failedMu.Lock()
				defer failedMu.Unlock()
				failedLate[name+"/"+key.String()] = writers[c].WriteFailure(key) != nil
			}}})
	}
	seedStart := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	var failMu sync.Mutex
	var failed error
	for i := range s.services {
		for c := 1; c < s.clusters; c++ {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if err := publishRetrying(ctx, writers[c].Publish, s.export(c, i, 0)); err != nil {
					failMu.Lock()
					failed = err
					failMu.Unlock()
				}
			}()
		}
		if i%100 == 99 {
			fmt.Printf("importer: %d of %d services written by all %d clusters, %v\n", i+1, s.services, s.clusters-1, time.Since(seedStart).Round(time.Second))
		}
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	fmt.Printf("importer: %d clusters x %d services written in %v\n", s.clusters-1, s.services, time.Since(seedStart).Round(time.Second))

	// The importer starts, and imports everything.
	tracker := track(ctx, b, env.Clusters[0], imports.ManagedBy, mcsv1beta1.LabelServiceName)
	cpu0 := processCPU(b)
	syncStart := time.Now()
	wait := env.StartControllers(ctx, cm.URL, func(*devenv.Cluster) logr.Logger { return benchLog("importer") }, nil)
	defer func() { cancel(); _ = wait() }()
	// Every IPv4 address of every cluster (IPv6 ones of the dual-stack
	// services are imported too where the cluster has the family).
	want := make([]int, s.services)
	for i := range want {
		for c := 1; c < s.clusters; c++ {
			for _, ep := range s.export(c, i, 0).Endpoints {
				if !strings.Contains(ep.IP, ":") {
					want[i]++
				}
			}
		}
		want[i] /= s.ports // addresses, not endpoint-ports
	}
	// A write Cloud Map failed late is written again, as the exporters'
	// reconcilers would on hearing of it (these writers do not watch):
	// every service still short a minute on is published again by every
	// writer (what is in place is left as it is).
	lastSaid := time.Now()
	waitAll(b, "import of every service", 30*time.Minute, func() bool {
		var short []int
		for i := range s.services {
			if len(tracker.ips(s.key(i).String())) < want[i] {
				short = append(short, i)
			}
		}
		if len(short) > 0 && time.Since(lastSaid) > time.Minute {
			lastSaid = time.Now()
			i := short[0]
			fmt.Printf("importer: %v after the start, %d services short, %s with %d of %d addresses: written again\n",
				time.Since(syncStart).Round(time.Second), len(short), s.key(i), len(tracker.ips(s.key(i).String())), want[i])
			for _, i := range short {
				for c := 1; c < s.clusters; c++ {
					if err := writers[c].Publish(ctx, s.export(c, i, 0)); err != nil {
						fmt.Printf("importer: writing %s of cluster-%02d again: %v\n", s.key(i), c, err)
					}
				}
			}
		}
		return len(short) == 0
	})
	synced := time.Since(syncStart)
	syncCPU := processCPU(b) - cpu0
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)

	// Idle, then pod changes, each after a quiet spell.
	quiet := m.watch.ActiveWindow + time.Second
	time.Sleep(30 * time.Second)
	idleFrom, idleCPU0 := time.Now(), processCPU(b)
	time.Sleep(time.Minute)
	idleCPU := (processCPU(b) - idleCPU0) / time.Since(idleFrom).Seconds()
	// A write that fails late is written again, as the exporter's
	// reconciler does when its change feed tells it (within a poll): here
	// each writer asks how its writes ended (GetOperation, 4 a round).
	for c := 1; c < s.clusters; c++ {
		go writers[c].ConfirmWrites(ctx)
	}
	var lat []time.Duration
	rewrites := 0
	cpu1 := processCPU(b)
	for n := range changes {
		time.Sleep(quiet)
		c, i := 1+n%(s.clusters-1), 3+n*7%(s.services-3)
		e := s.export(c, i, 1+n/(s.services-3))
		ip := e.Endpoints[len(e.Endpoints)-1].IP
		start := time.Now()
		if err := writers[c].Publish(ctx, e); err != nil {
			b.Fatal(err)
		}
		for !tracker.ips(e.Key.String())[ip] {
			if time.Since(start) > 2*time.Minute {
				b.Fatalf("change %d (%s of %s in %s) not imported in 2 minutes (write failed late: %v)", n, ip, e.Key, e.Cluster, writers[c].WriteFailure(e.Key))
			}
			failedMu.Lock()
			again := failedLate[e.Cluster+"/"+e.Key.String()]
			delete(failedLate, e.Cluster+"/"+e.Key.String())
			failedMu.Unlock()
			if again {
				rewrites++
				fmt.Printf("importer: change %d failed late (%v): written again\n", n, writers[c].WriteFailure(e.Key))
				if err := writers[c].Publish(ctx, e); err != nil && !errors.As(err, new(*registry.LateFailureError)) {
					b.Fatal(err)
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	changeCPU := processCPU(b) - cpu1 - float64(changes)*quiet.Seconds()*idleCPU

	fmt.Printf("Importer: the real controller at the shipped defaults importing %d clusters x %d services (%d namespaces) from one emulator under the %s profile, %d cores:\n",
		s.clusters-1, s.services, s.namespaces, m.profile.Name, runtimeCores())
	fmt.Printf("  everything imported %v after the controller started (%.0f CPU-s in this process: controller, emulator, tracker)\n", synced.Round(time.Second), syncCPU)
	fmt.Printf("  heap in use after the import: %d MiB (the emulator's state included)\n", mem.HeapInuse>>20)
	fmt.Printf("  idle: %.3f CPU-s per second\n", idleCPU)
	fmt.Printf("  a pod change, %d each after %v quiet (%d written again after Cloud Map failed them late): p50 %v, %.3f CPU-s each above idle\n", changes, quiet, rewrites, percentile(lat, 50).Round(time.Millisecond), changeCPU/float64(changes))
	within(b, "  ... quiet p99", percentile(lat, 99), m.changeBound(), m.changeWhy())
}

// processCPU is this process's CPU time so far, in seconds (user and
// system, from /proc/self/stat at 100 ticks a second).
func processCPU(b testing.TB) float64 {
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}

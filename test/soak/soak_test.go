//go:build e2e

// Package soak is the fault campaign: clusters running the real
// controller binary in all three modes (MCS, Cloud Map DNS registration,
// syndication) under bulk exports and pod churn, while controllers are
// killed, an apiserver restarts, the Cloud Map emulator stops and comes
// back from its data directory, every call is throttled, then hangs, a
// member cluster stops, a cluster's controllers restart in a wrong Region,
// then with a Region down, and a hostile writer forges records; and, over
// a hub registry, the hub restarts, is cut off, and a member's credentials
// are revoked (hub_test.go). It counts what was lost or left behind and
// how long the fleet takes to converge after the last fault.
//
// `make test` runs a short campaign; `make soak` (CLUSTERMAP_SOAK=full)
// the full one.
package soak

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/supervise"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// settings of one campaign.
type settings struct {
	clusters                           int
	mcs, syn, dns                      int // initial services of each kind per cluster
	kills                              int
	emulatorDown, throttle, memberDown time.Duration
	wrongRegion, regionDown            time.Duration
	hubDown, revoked                   time.Duration // the hub unreachable; a member's hub credentials revoked
	// converge is the promise the full campaign checks; the short one, run
	// by make test on machines of any speed, reports the time and checks
	// only that every count reaches 0 (a timed assertion there flakes).
	converge                time.Duration
	churnEvery, exportEvery time.Duration // a Deployment scaled; a Service published or withdrawn
}

var (
	short = settings{clusters: 2, mcs: 6, syn: 3, dns: 3, kills: 5,
		emulatorDown: 20 * time.Second, throttle: 20 * time.Second, memberDown: 20 * time.Second,
		wrongRegion: 15 * time.Second, regionDown: 15 * time.Second,
		hubDown: 40 * time.Second, revoked: 40 * time.Second,
		churnEvery: 700 * time.Millisecond, exportEvery: 2 * time.Second}
	full = settings{clusters: 3, mcs: 30, syn: 10, dns: 10, kills: 20,
		emulatorDown: 5 * time.Minute, throttle: 2 * time.Minute, memberDown: 2 * time.Minute,
		wrongRegion: 2 * time.Minute, regionDown: 2 * time.Minute,
		hubDown: 5 * time.Minute, revoked: 3 * time.Minute,
		converge: 30 * time.Second, churnEvery: 500 * time.Millisecond, exportEvery: 3 * time.Second}
)

const (
	nsMCS, nsSyn, nsDNS = "soak", "soak-syn", "soak-dns"
	dnsNamespace        = "soak.local" // the Cloud Map namespace annotated Services register in
	replicasPerCluster  = 2            // controller replicas, leader-elected, as the chart runs them
)

type fleet struct {
	s        settings
	env      *devenv.Env
	clients  []client.Client
	ids      []string
	cm       *supervise.Process
	cmURL    string
	cmAdmin  string
	sd       *sd.Client
	ctrls    [][]*supervise.Process
	hub      *hubSide // a hub fleet's registry; nil: Cloud Map
	kinds    []kind   // what the workload publishes
	w        *workload
	mu       sync.Mutex
	down     map[int]bool // clusters stopped on purpose
	ownMu    sync.Mutex
	ownCalls map[string]int // the test's own Cloud Map calls by operation, not counted as the controllers'
}

func TestFaultCampaign(t *testing.T) {
	s := campaignSettings()
	f := start(t, s)
	// took: the emulator answered at least one call with code meanwhile.
	took := func(name, code string, fn func()) {
		f.took(t, name, "no call answered "+code, func() float64 { return harness.EmulatorResults(t, f.cmAdmin)[code] }, fn)
	}
	f.campaign(t, s.emulatorDown+s.throttle+s.throttle/2+s.memberDown+s.wrongRegion+s.regionDown, func() {
		f.phase(t, "apiserver restart", func() { f.restartCluster(t, len(f.ids)-1) })
		f.phase(t, "emulator stopped", func() { f.stopEmulator(t, s.emulatorDown) })
		took("every call throttled", "RequestLimitExceeded", func() { f.fault(t, `{"rateLimits": {"*": {"rate": 0.000001, "burst": 1}}}`, s.throttle) })
		// Connections that hang: calls in flight when it ends still hang until
		// the controllers give up on them (10 s an attempt).
		took("every call hangs", "RequestTimeout", func() { f.fault(t, `{"hang": true}`, s.throttle/2) })
		f.phase(t, "member cluster stopped", func() { f.stopMember(t, 0, s.memberDown) })
		// What a wrong Region reads is nothing: its imports must stay, and
		// what it withdraws meanwhile (where its records are not) is withdrawn
		// where they are once it is right again.
		f.phase(t, "restart in a wrong Region", func() {
			f.restartWith(t, len(f.ids)-1, s.wrongRegion, []string{"AWS_REGION=" + wrongRegion}, nil)
		})
		// Reading a second Region that is down: creations and updates from the
		// home Region go on.
		took("a Region down at restart", "ServiceUnavailable", func() {
			put := f.faults(t)
			put(`{"outage": true, "regions": ["` + downRegion + `"]}`)
			f.restartWith(t, 0, s.regionDown, nil, []string{"--regions", "us-east-1," + downRegion})
			put(`{}`)
		})
		// A writer of the account forges records into every exported service:
		// invalid ones under the exporter's name, and ones under another
		// cluster's name with ids not its own. None may be imported; they stay
		// to the end of the campaign.
		f.phase(t, "a hostile writer's records", func() { f.forge(t) })
	})
}

// campaignSettings are the short campaign's, or with CLUSTERMAP_SOAK=full
// the full one's.
func campaignSettings() settings {
	if os.Getenv("CLUSTERMAP_SOAK") == "full" {
		return full
	}
	return short
}

// campaign populates the fleet and awaits it, runs faults (lasting about
// faultsFor) under churn and random controller kills, then awaits
// convergence: every count at zero (within the promise, if it has one).
func (f *fleet) campaign(t *testing.T, faultsFor time.Duration, faults func()) {
	s := f.s
	ctx := context.Background()
	f.populate(t)
	harness.EventuallyEvery(t, time.Second, 3*time.Minute, "the initial workload converges", func() error { return f.check(ctx).err() })
	t.Logf("initial workload converged: %d items", len(f.w.snapshot()))

	// Faults, with churn and random kills throughout.
	stopChurn := f.churn(t)
	stopMonitor := f.monitor(t)
	faultsStart := time.Now()
	killsDone := f.killAtRandom(t, s.kills, faultsFor+30*time.Second)
	faults()
	<-killsDone
	lastFault := time.Now()
	stopChurn()
	callsBefore := f.calls(t)

	// Convergence: every count at zero.
	var final counts
	var lastBehind error // what had not converged at the last check before it did
	converged := time.Duration(-1)
	lastReport := time.Now()
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		final = f.check(ctx)
		behind := final.err()
		if behind == nil {
			converged = time.Since(lastFault)
			break
		}
		lastBehind = behind
		if time.Since(lastReport) >= 5*time.Second {
			lastReport = time.Now()
			t.Logf("converging, %.0fs after the last fault: %v", time.Since(lastFault).Seconds(), behind)
		}
	}
	callsAfter := f.calls(t)
	lost := stopMonitor()
	final.lostWhileLive = lost
	t.Logf("campaign: %d clusters, %d items at the end, %d churn operations, %d controller kills, faults for %v",
		len(f.ids), len(f.w.snapshot()), f.w.ops(), s.kills, lastFault.Sub(faultsStart).Round(time.Second))
	t.Logf("imports or replicas lost while their export lived: %d", len(final.lostWhileLive))
	t.Logf("imports or replicas left after their export ended: %d", len(final.leftAfterEnd))
	t.Logf("registry records with no live endpoint:            %d", len(final.strayRecords))
	t.Logf("endpoints missing from the registry:               %d", len(final.missingEndpoints))
	t.Logf("imports or replicas not matching their source:     %d", len(final.mismatched))
	if f.sd != nil {
		t.Logf("Cloud Map calls meanwhile, fleet-wide:             %d control-plane, %d Discover* (%d controllers at %d control calls/s each)",
			callsAfter.control-callsBefore.control, callsAfter.data-callsBefore.data, len(f.ids), controller.DefaultCloudMapQPS)
		t.Logf("  by operation: %s", callsAfter.since(callsBefore))
	}
	if converged >= 0 {
		t.Logf("time to converge after the last fault:             %.1fs", converged.Seconds())
		if lastBehind != nil {
			t.Logf("  the last to converge: %v", lastBehind)
		}
	} else {
		t.Logf("time to converge after the last fault:             not within 5m")
	}
	if err := final.err(); err != nil || converged < 0 || (s.converge > 0 && converged > s.converge) {
		for _, ps := range f.ctrls {
			for _, p := range ps {
				t.Logf("--- %s (started %d times), last lines:\n%s", p.Name, p.Starts(), tail(p, 15))
			}
		}
		f.explain(t, err)
		why := fmt.Sprint(err)
		if err == nil {
			why = fmt.Sprintf("longer than the promise, %v", s.converge)
		}
		t.Fatalf("the fleet did not converge after the last fault (took %v): %s", converged, why)
	}
}

// phase runs one fault and logs how long it lasted.
func (f *fleet) phase(t *testing.T, name string, fn func()) {
	began := time.Now()
	fn()
	t.Logf("fault %-28s %6.1fs", name, time.Since(began).Seconds())
}

// took runs a phase and fails the campaign unless effect (a running count
// of what the fault met: calls it answered, traffic it held, refusals)
// grew meanwhile: a fault that never hit a call proves nothing. A call is
// counted when it is answered, and a hung call is answered only when its
// caller gives up (10 s an attempt), which may be after the phase: the
// count is awaited that long.
func (f *fleet) took(t *testing.T, name, none string, effect func() float64, fn func()) {
	before := effect()
	f.phase(t, name, fn)
	n := 0.0
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if n = effect() - before; n > 0 || time.Now().After(deadline) {
			break
		}
	}
	if n == 0 {
		t.Errorf("fault %q took no effect: %s", name, none)
	} else {
		t.Logf("fault %q met %.0f times", name, n)
	}
}

// newFleet makes the fleet's clusters, with a client of each and the
// campaign's namespaces; the workload publishes kinds. It returns the
// directory the processes log to.
func newFleet(t *testing.T, s settings, kinds []kind) (*fleet, string) {
	dir := t.TempDir()
	if keep := os.Getenv("CLUSTERMAP_SOAK_LOGS"); keep != "" {
		dir = keep // the processes' logs, kept to read after a failure
	}
	env := harness.Clusters(t, s.clusters)
	f := &fleet{s: s, env: env, kinds: kinds, down: map[int]bool{}, w: newWorkload(), ownCalls: map[string]int{}}
	for _, c := range env.Clusters {
		cl := harness.Client(t, c.Config)
		f.clients = append(f.clients, cl)
		f.ids = append(f.ids, c.ID)
		for _, ns := range []string{nsMCS, nsSyn, nsDNS, kube.DefaultStatusNamespace} {
			harness.Must(t, createNamespace(cl, ns))
		}
	}
	return f, dir
}

// start is a fleet over Cloud Map, every mode.
func start(t *testing.T, s settings) *fleet {
	f, dir := newFleet(t, s, kinds)
	// The emulator, as its own process, so it can stop and come back from
	// its data directory.
	api, admin := harness.FreeAddr(t), harness.FreeAddr(t)
	f.cmURL, f.cmAdmin = "http://"+api, "http://"+admin
	f.cm = startProc(t, dir, "cloudmap-local", nil, filepath.Join(devenv.BinDir(), "cloudmap-local"), "--listen", api, "--admin-listen", admin, "--data-dir", filepath.Join(dir, "cloudmap"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	harness.Must(t, harness.WaitListening(ctx, api))
	c := cloudmaptest.ClientOf(t, f.cmURL, cloudmapclient.Options{
		OnCall: func(op string, _ error) { f.ownMu.Lock(); f.ownCalls[op]++; f.ownMu.Unlock() }})
	f.sd = c
	cloudmaptest.DNSNamespace(t, c, dnsNamespace, "vpc-soak")

	peers, err := f.env.PeerDirs(context.Background(), filepath.Join(dir, "peers"), replication.PeerAccess{})
	harness.Must(t, err)
	awsEnv := []string{"AWS_ACCESS_KEY_ID=soak", "AWS_SECRET_ACCESS_KEY=soak", "AWS_REGION=us-east-1"}
	f.startControllers(t, dir, awsEnv, func(c *devenv.Cluster) []string {
		return []string{"--cloudmap-endpoint", f.cmURL, "--cloudmap-dns", "--syndicate", "--peers-dir", peers[c.ID],
			"--namespaces", strings.Join([]string{nsMCS, nsSyn, nsDNS}, ",")}
	})
	return f
}

// startControllers runs the controllers: the real binary at the shipped
// defaults (call budgets, drift period, grace period), two replicas per
// cluster under leader election as the chart runs them, with env and the
// flags args gives for each cluster.
func (f *fleet) startControllers(t *testing.T, dir string, env []string, args func(*devenv.Cluster) []string) {
	for _, c := range f.env.Clusters {
		var ps []*supervise.Process
		for r := range replicasPerCluster {
			name := fmt.Sprintf("%s-controller-%d", c.ID, r)
			// POD_NAME as the chart sets it: the replica's lease identity,
			// kept across its restarts as a pod's name is.
			argv := append([]string{filepath.Join(devenv.BinDir(), "clustermap"), "controller",
				"--kubeconfig", f.env.Kubeconfig, "--context", c.ID, "--cluster-name", c.ID,
				"--leader-elect", "--leader-election-namespace", kube.DefaultStatusNamespace,
				"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, args(c)...)
			ps = append(ps, startProc(t, dir, name, append([]string{"POD_NAME=" + name}, env...), argv...))
		}
		f.ctrls = append(f.ctrls, ps)
	}
}

// killAtRandom kills n controller replicas (any cluster, leader or not) at
// random moments within d; the channel closes after the last.
func (f *fleet) killAtRandom(t *testing.T, n int, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	at := make([]time.Duration, n)
	for i := range at {
		at[i] = time.Duration(rand.Int64N(int64(d)))
	}
	go func() {
		defer close(done)
		began := time.Now()
		slices.Sort(at)
		for _, when := range at {
			time.Sleep(time.Until(began.Add(when)))
			ci := rand.IntN(len(f.ctrls))
			f.mu.Lock()
			isDown := f.down[ci]
			f.mu.Unlock()
			if isDown {
				ci = (ci + 1) % len(f.ctrls)
			}
			p := f.ctrls[ci][rand.IntN(len(f.ctrls[ci]))]
			p.Kill()
			t.Logf("kill -9 %s at %v", p.Name, when.Round(time.Second))
		}
	}()
	return done
}

// restartCluster stops a cluster's components and starts them at once.
func (f *fleet) restartCluster(t *testing.T, i int) {
	ctx := context.Background()
	f.setDown(i, true)
	harness.Must(t, f.env.StopCluster(ctx, f.env.Clusters[i]))
	harness.Must(t, f.env.StartCluster(ctx, f.env.Clusters[i]))
	f.setDown(i, false)
}

// stopMember stops a member cluster, its controllers with it, for d.
func (f *fleet) stopMember(t *testing.T, i int, d time.Duration) {
	ctx := context.Background()
	f.setDown(i, true)
	for _, p := range f.ctrls[i] {
		p.Stop()
	}
	harness.Must(t, f.env.StopCluster(ctx, f.env.Clusters[i]))
	time.Sleep(d)
	harness.Must(t, f.env.StartCluster(ctx, f.env.Clusters[i]))
	for _, p := range f.ctrls[i] {
		p.Start()
	}
	f.setDown(i, false)
}

func (f *fleet) setDown(i int, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down[i] = down
}

func (f *fleet) isDown(i int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down[i]
}

// stopEmulator stops Cloud Map (SIGTERM: it saves its state) for d and
// starts it again from its data directory on the same address.
func (f *fleet) stopEmulator(t *testing.T, d time.Duration) {
	f.cm.Stop()
	time.Sleep(d)
	f.cm.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	harness.Must(t, harness.WaitListening(ctx, strings.TrimPrefix(f.cmURL, "http://")))
}

// Regions of the faults: one restarted into (nothing of the clusterset is
// there), one read beside the home Region while it is down.
const wrongRegion, downRegion = "eu-west-1", "ap-south-1"

// restartWith restarts cluster i's controllers with env and args added,
// runs them so for d, and restarts them as they were.
func (f *fleet) restartWith(t *testing.T, i int, d time.Duration, env, args []string) {
	ps := f.ctrls[i]
	type was struct{ env, argv []string }
	before := make([]was, len(ps))
	for j, p := range ps {
		p.Stop()
		before[j] = was{p.Env, p.Argv}
		p.Env, p.Argv = append(slices.Clone(p.Env), env...), append(slices.Clone(p.Argv), args...)
		p.Start()
	}
	time.Sleep(d)
	for j, p := range ps {
		p.Stop()
		p.Env, p.Argv = before[j].env, before[j].argv
		p.Start()
	}
}

// fault sets the emulator's faults (JSON) for d.
func (f *fleet) fault(t *testing.T, faults string, d time.Duration) {
	put := f.faults(t)
	put(faults)
	time.Sleep(d)
	put(`{}`)
}

// faults sets the emulator's faults (JSON).
func (f *fleet) faults(t *testing.T) func(string) {
	return func(body string) {
		req, err := http.NewRequest(http.MethodPut, f.cmAdmin+"/faults", bytes.NewBufferString(body))
		harness.Must(t, err)
		resp, err := http.DefaultClient.Do(req)
		harness.Must(t, err)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("PUT /faults: %s", resp.Status)
		}
	}
}

type callCount struct {
	control, data int
	byOp          map[string]int
}

// calls reads the emulator's count of API calls, every result included,
// less the test's own.
func (f *fleet) calls(t *testing.T) callCount {
	c := callCount{byOp: map[string]int{}}
	if f.sd == nil {
		return c // a hub fleet: no Cloud Map
	}
	for op, n := range harness.EmulatorCalls(t, f.cmAdmin) {
		c.byOp[op] += int(n)
	}
	f.ownMu.Lock()
	for op, n := range f.ownCalls {
		c.byOp[op] -= n
	}
	f.ownMu.Unlock()
	for op, n := range c.byOp {
		if strings.HasPrefix(op, "DiscoverInstances") {
			c.data += n
		} else {
			c.control += n
		}
	}
	return c
}

// since prints the calls made since an earlier count, by operation, most
// first.
func (c callCount) since(before callCount) string {
	type opCount struct {
		op string
		n  int
	}
	var ops []opCount
	for op, n := range c.byOp {
		if d := n - before.byOp[op]; d > 0 {
			ops = append(ops, opCount{op, d})
		}
	}
	slices.SortFunc(ops, func(a, b opCount) int { return b.n - a.n })
	var parts []string
	for _, o := range ops {
		parts = append(parts, fmt.Sprintf("%s %d", o.op, o.n))
	}
	return strings.Join(parts, ", ")
}

// explain logs, for each item the unconverged check names, what the
// clusters hold of its Service and the Events about it: what happened to
// it, when the controllers' logs do not say.
func (f *fleet) explain(t *testing.T, err error) {
	if err == nil {
		return
	}
	ctx := context.Background()
	for j, cl := range f.clients {
		if f.isDown(j) {
			continue
		}
		for _, k := range kinds {
			evs := &corev1.EventList{}
			if cl.List(ctx, evs, client.InNamespace(k.namespace())) != nil {
				continue
			}
			for _, ev := range evs.Items {
				name := ev.InvolvedObject.Name
				if !strings.Contains(err.Error(), " "+name+" ") && !strings.Contains(err.Error(), "/"+name+"@") {
					continue
				}
				t.Logf("cluster %d, %s %s/%s: %s %s x%d (%s .. %s): %s", j, ev.InvolvedObject.Kind, ev.Namespace, name,
					ev.Type, ev.Reason, ev.Count, ev.FirstTimestamp.Format(time.TimeOnly), ev.LastTimestamp.Format(time.TimeOnly), ev.Message)
			}
			svcs := &corev1.ServiceList{}
			if cl.List(ctx, svcs, client.InNamespace(k.namespace())) != nil {
				continue
			}
			for _, s := range svcs.Items {
				if strings.Contains(err.Error(), "/"+s.Name+"@") {
					t.Logf("cluster %d, Service %s/%s: deleting since %v, finalizers %v, annotations %v", j, s.Namespace, s.Name, s.DeletionTimestamp, s.Finalizers, s.Annotations)
				}
			}
		}
	}
}

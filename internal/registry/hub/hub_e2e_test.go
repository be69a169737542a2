//go:build e2e

package hub_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/internal/registry/registrytest"
	"github.com/clustermap/clustermap/test/harness"
)

// hubEnv is one hub cluster (a kwok cluster's real kube-apiserver and
// etcd) that the tests of this file share, each in clustersets of its own.
type hubEnv struct {
	env   *devenv.Env
	admin *rest.Config
	next  atomic.Int32
}

func startHub(t *testing.T) *hubEnv {
	ctrllog.SetLogger(harness.HeldLog(t)) // the hub cache's reflectors log through it
	env := harness.Clusters(t, 1)
	return &hubEnv{env: env, admin: env.Clusters[0].Config}
}

// clusterset installs a clusterset of its own on the hub: its id is
// name with a prefix no other test uses.
func (h *hubEnv) clusterset(t *testing.T, name string) string {
	t.Helper()
	set := fmt.Sprintf("t%d-%s", h.next.Add(1), name)
	harness.Must(t, hub.Init(context.Background(), h.admin, set))
	return set
}

// member joins cluster to set and returns its hub config: what the
// member's controller would run with (its kubeconfig from Join).
func (h *hubEnv) member(t *testing.T, set, cluster string) *rest.Config {
	t.Helper()
	return h.memberIn(t, set, cluster, "")
}

// memberIn is member, joined as in region.
func (h *hubEnv) memberIn(t *testing.T, set, cluster, region string) *rest.Config {
	t.Helper()
	data, expiry, err := hub.Join(context.Background(), h.admin, set, cluster, region, "", time.Hour)
	harness.Must(t, err)
	if time.Until(expiry) < 50*time.Minute {
		t.Fatalf("token expires %v, want about an hour from now", expiry)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	harness.Must(t, err)
	return cfg
}

func (h *hubEnv) registry(t *testing.T, set, cluster string, o hub.Options) *hub.Registry {
	t.Helper()
	o.ClusterSet, o.Cluster = set, cluster
	r, err := hub.New(h.member(t, set, cluster), o)
	harness.Must(t, err)
	return r
}

// TestRegistrySuite holds the hub to the registry contract every backend
// keeps, each member writing with the kubeconfig Join gave it (under the
// hub's admission policy).
func TestRegistrySuite(t *testing.T) {
	h := startHub(t)
	registrytest.Run(t, func(t *testing.T) registrytest.New {
		sets := map[string]string{}
		var mu sync.Mutex
		return func(t *testing.T, set, cluster string) registry.Registry {
			mu.Lock()
			if sets[set] == "" {
				sets[set] = h.clusterset(t, set)
			}
			hubSet := sets[set]
			mu.Unlock()
			r, err := hub.New(h.member(t, hubSet, cluster), hub.Options{ClusterSet: set, Cluster: cluster, Namespace: hub.Namespace(hubSet)})
			harness.Must(t, err)
			return r
		}
	})
}

// heard keeps the last word of a watch on each service.
type heard struct {
	mu     sync.Mutex
	sets   map[registry.Key][]registry.Export
	synced chan struct{}
	once   sync.Once
}

func watch(t *testing.T, ctx context.Context, r *hub.Registry) *heard {
	t.Helper()
	h := &heard{sets: map[registry.Key][]registry.Export{}, synced: make(chan struct{})}
	go func() {
		_ = r.Watch(ctx, registry.SinkFuncs{
			OnSet: func(k registry.Key, e []registry.Export) {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.sets[k] = e
			},
			OnSynced: func() { h.once.Do(func() { close(h.synced) }) },
		})
	}()
	select {
	case <-h.synced:
	case <-time.After(time.Minute):
		t.Fatal("the watch did not sync within a minute")
	}
	return h
}

func (h *heard) of(key registry.Key) []registry.Export {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sets[key]
}

var cart = registry.Key{Namespace: "shop", Name: "cart"}

// TestMembersWriteOnlyTheirOwn: with the kubeconfig Join gives it, a
// member cannot create, change or delete another member's records, nor
// renew its Lease; the hub's CRD refuses a chunk past its bounds and a
// name that does not follow from the spec.
func TestMembersWriteOnlyTheirOwn(t *testing.T) {
	h := startHub(t)
	set := h.clusterset(t, "set")
	ns := hub.Namespace(set)
	ctx := context.Background()
	victim := h.registry(t, set, "victim", hub.Options{})
	e := registrytest.Export(set, "victim", 3)
	harness.Must(t, victim.Publish(ctx, e))
	go victim.Heartbeat(ctx)

	c := harness.ClientWith(t, h.member(t, set, "mallory"), hub.Scheme())
	refused := func(what string, err error, by string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), by) {
			t.Errorf("%s: %v, want refused (%s)", what, err, by)
		}
	}
	const policy = "writes only the"
	forged, err := hub.Chunks(ns, registrytest.Export(set, "victim", 1))
	harness.Must(t, err)
	refused("creating another member's export", c.Create(ctx, forged[0]), policy)

	held := &hubv1alpha1.ClusterExport{}
	harness.Must(t, c.Get(ctx, client.ObjectKey{Namespace: ns, Name: hub.ObjectName("victim", cart, 0)}, held))
	changed := held.DeepCopy()
	changed.Spec.Endpoints = nil
	refused("emptying another member's export", c.Update(ctx, changed), policy)
	stolen := held.DeepCopy()
	stolen.Spec.Cluster = "mallory"
	refused("taking another member's export", c.Update(ctx, stolen), policy)
	refused("deleting another member's export", c.Delete(ctx, held), policy)

	lease := &coordinationv1.Lease{}
	harness.Eventually(t, 30*time.Second, "the victim's Lease", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: hub.LeaseName("victim")}, lease)
	})
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now().Add(-time.Hour)))
	refused("changing another member's Lease", c.Update(ctx, lease), policy)
	refused("deleting another member's Lease", c.Delete(ctx, lease), policy)
	refused("creating a Lease of another name", c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "member-victim2"}}), policy)

	// Its own records: bounded by the CRD's schema.
	own, err := hub.Chunks(ns, registrytest.Export(set, "mallory", 1))
	harness.Must(t, err)
	bomb := own[0].DeepCopy()
	for len(bomb.Spec.Endpoints) <= hubv1alpha1.MaxChunkEndpoints {
		bomb.Spec.Endpoints = append(bomb.Spec.Endpoints, bomb.Spec.Endpoints[0])
	}
	refused("a chunk of more than 1,000 endpoints", c.Create(ctx, bomb), "Too many")
	far := own[0].DeepCopy()
	far.Spec.Chunks, far.Spec.Chunk, far.Name = 1000, 999, hub.ObjectName("mallory", cart, 999)
	refused("a chunk past the 20th", c.Create(ctx, far), "spec.chunk")
	misnamed := own[0].DeepCopy()
	misnamed.Name = hub.ObjectName("victim", cart, 0) + "x"
	refused("a name that does not follow from the spec", c.Create(ctx, misnamed), "name is <service namespace>")
	if err := c.Create(ctx, own[0]); err != nil {
		t.Errorf("mallory's own export: %v", err)
	}
	if err := c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: hub.LeaseName("mallory")}}); err != nil {
		t.Errorf("mallory's own Lease: %v", err)
	}

	// Around the policy (an admin's hand, or a hub without admission
	// policies): a record whose name does not follow from its spec is
	// not read.
	ghost, err := hub.Chunks(ns, registrytest.Export(set, "ghost", 1))
	harness.Must(t, err)
	ghost[0].Name = hub.ObjectName("elsewhere", cart, 0)
	harness.Must(t, h.adminClient(t).Create(ctx, ghost[0]))

	// The victim's export is whole after all of it.
	w := watch(t, ctx, h.registry(t, set, "reader", hub.Options{}))
	harness.Eventually(t, 30*time.Second, "the victim's export, whole", func() error {
		for _, got := range w.of(cart) {
			if got.Cluster == "victim" && len(got.Endpoints) == len(e.Endpoints) {
				return nil
			}
		}
		return fmt.Errorf("exports %v", w.of(cart))
	})
	for _, got := range w.of(cart) {
		if got.Cluster == "ghost" {
			t.Error("a misnamed record was read as cluster ghost's export")
		}
	}
}

// TestLargeExportIsChunked: 2,500 endpoints are four objects (at three
// quarters full), heard whole; one pod fewer rewrites its chunks and the
// head, not the others; shrunk to 12, the surplus chunks go.
func TestLargeExportIsChunked(t *testing.T) {
	h := startHub(t)
	set := h.clusterset(t, "set")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := watch(t, ctx, h.registry(t, set, "reader", hub.Options{}))
	r := h.registry(t, set, "big", hub.Options{})
	e := registrytest.Export(set, "big", 625) // 625 pods x 2 families x 2 ports
	harness.Must(t, r.Publish(ctx, e))
	held, err := r.Held(ctx, cart)
	harness.Must(t, err)
	if len(held) != 4 {
		t.Fatalf("%d objects hold 2,500 endpoints, want 4", len(held))
	}
	harness.Eventually(t, 30*time.Second, "2,500 endpoints", func() error {
		if got := w.of(cart); len(got) != 1 || len(got[0].Endpoints) != 2500 {
			return fmt.Errorf("heard %d exports", len(got))
		}
		return nil
	})
	// One pod (two addresses) fewer.
	harness.Must(t, r.Publish(ctx, registrytest.Export(set, "big", 624)))
	after, err := r.Held(ctx, cart)
	harness.Must(t, err)
	var rewritten []string
	for name, o := range after {
		if o.ResourceVersion != held[name].ResourceVersion {
			rewritten = append(rewritten, name)
		}
	}
	if len(rewritten) > 3 || !slices.Contains(rewritten, "shop.cart.big.0") {
		t.Errorf("one pod fewer rewrote %v of 4 chunks: want its chunks (at most 2) and the head", rewritten)
	}
	harness.Eventually(t, 30*time.Second, "2,496 endpoints", func() error {
		if got := w.of(cart); len(got) != 1 || len(got[0].Endpoints) != 2496 {
			return fmt.Errorf("heard %d exports", len(got))
		}
		return nil
	})
	e = registrytest.Export(set, "big", 3)
	harness.Must(t, r.Publish(ctx, e))
	if held, _ = r.Held(ctx, cart); len(held) != 1 {
		t.Fatalf("%d objects hold 12 endpoints, want 1", len(held))
	}
	harness.Eventually(t, 30*time.Second, "12 endpoints", func() error {
		if got := w.of(cart); len(got) != 1 || len(got[0].Endpoints) != 12 {
			return fmt.Errorf("heard %v", got)
		}
		return nil
	})
}

// TestSilentMemberIsDrained: a member whose Lease stops moving is drained
// (its exports heard with Silent) while another's moves, and restored
// once it moves again. Heartbeat and SilentAfter are a second and 8 s
// here, not the shipped 30 s and 2 min, so that the drain happens within
// the test (8 renewals of margin for a loaded machine).
func TestSilentMemberIsDrained(t *testing.T) {
	h := startHub(t)
	set := h.clusterset(t, "set")
	ctx := context.Background()
	quick := hub.Options{Heartbeat: time.Second, SilentAfter: 8 * time.Second}
	w := watch(t, ctx, h.registry(t, set, "reader", quick))
	for _, cluster := range []string{"alive", "dying"} {
		harness.Must(t, h.registry(t, set, cluster, quick).Publish(ctx, registrytest.Export(set, cluster, 1)))
	}
	dyingCtx, die := context.WithCancel(ctx)
	go h.registry(t, set, "alive", quick).Heartbeat(ctx)
	go h.registry(t, set, "dying", quick).Heartbeat(dyingCtx)
	silent := func(want bool) func() error {
		return func() error {
			got := w.of(cart)
			if len(got) != 2 {
				return fmt.Errorf("%d exports", len(got))
			}
			if !got[0].Silent.IsZero() {
				return fmt.Errorf("alive drained")
			}
			if got[1].Silent.IsZero() == want {
				return fmt.Errorf("dying drained: %v", !got[1].Silent.IsZero())
			}
			return nil
		}
	}
	time.Sleep(10 * time.Second) // past SilentAfter with both beating
	harness.Must(t, silent(false)())
	die()
	harness.Eventually(t, 30*time.Second, "the silent member drained", silent(true))
	go h.registry(t, set, "dying", quick).Heartbeat(ctx)
	harness.Eventually(t, 30*time.Second, "the member restored", silent(false))
}

// TestMembersRegions: the Region the hub's admin gives each member at
// join is every member's word on it (each export carries its member's,
// and a member knows its own), follows a join that changes it, and no
// member can write it.
func TestMembersRegions(t *testing.T) {
	h := startHub(t)
	set := h.clusterset(t, "regions")
	ctx := context.Background()
	east, err := hub.New(h.memberIn(t, set, "east", "us-east-1"), hub.Options{ClusterSet: set, Cluster: "east"})
	harness.Must(t, err)
	westCfg := h.memberIn(t, set, "west", "eu-west-1")
	west, err := hub.New(westCfg, hub.Options{ClusterSet: set, Cluster: "west"})
	harness.Must(t, err)
	w := watch(t, ctx, east)
	harness.Must(t, west.Publish(ctx, registrytest.Export(set, "west", 1)))
	regionOf := func(want string) func() error {
		return func() error {
			got := w.of(cart)
			if len(got) != 1 || got[0].Region != want {
				return fmt.Errorf("exports %d, Region %q, want %q", len(got), func() string {
					if len(got) == 0 {
						return ""
					}
					return got[0].Region
				}(), want)
			}
			if east.Region() != "us-east-1" {
				return fmt.Errorf("east says it is in %q", east.Region())
			}
			return nil
		}
	}
	harness.Eventually(t, 30*time.Second, "west's export from eu-west-1", regionOf("eu-west-1"))
	h.memberIn(t, set, "west", "us-west-2")
	harness.Eventually(t, 30*time.Second, "west moved to us-west-2", regionOf("us-west-2"))

	c := harness.ClientWith(t, westCfg, hub.Scheme())
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: hub.Namespace(set), Name: "member-west"}}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+hub.LabelRegion+`":"us-east-1"}}}`))
	if err := c.Patch(ctx, sa, patch); !apierrors.IsForbidden(err) {
		t.Errorf("a member writing its own Region: %v, want forbidden", err)
	}
}

// TestHubDownRemovesNothing: while the hub is stopped, a watcher keeps
// every export and drains nobody, and publishing fails; once the hub is
// back nobody is drained either, and a change is heard again.
func TestHubDownRemovesNothing(t *testing.T) {
	h := startHub(t)
	set := h.clusterset(t, "set")
	ctx := context.Background()
	quick := hub.Options{Heartbeat: time.Second, SilentAfter: 5 * time.Second} // a TTL the 10 s outage passes
	w := watch(t, ctx, h.registry(t, set, "reader", quick))
	r := h.registry(t, set, "exporter", quick)
	harness.Must(t, r.Publish(ctx, registrytest.Export(set, "exporter", 2)))
	go r.Heartbeat(ctx)
	harness.Eventually(t, 30*time.Second, "the export", func() error {
		if len(w.of(cart)) != 1 {
			return fmt.Errorf("not heard")
		}
		return nil
	})
	hub := h.env.Clusters[0]
	harness.Must(t, h.env.StopCluster(ctx, hub))
	for range 10 { // 10 s: past SilentAfter
		time.Sleep(time.Second)
		if got := w.of(cart); len(got) != 1 || len(got[0].Endpoints) != 8 || !got[0].Silent.IsZero() {
			t.Fatalf("with the hub down, heard %v", got)
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := r.Publish(pctx, registrytest.Export(set, "exporter", 3)); err == nil {
		t.Error("publish with the hub down succeeded")
	}
	cancel()
	harness.Must(t, h.env.StartCluster(ctx, hub))
	// Back from an outage longer than the TTL, whoever is seen renewing
	// first drains nobody (proofs.stalled).
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got := w.of(cart); len(got) != 1 || !got[0].Silent.IsZero() {
			t.Fatalf("after the hub came back, heard %v", got)
		}
	}
	harness.Eventually(t, 2*time.Minute, "a publish after the hub is back", func() error { return r.Publish(ctx, registrytest.Export(set, "exporter", 3)) })
	harness.Eventually(t, time.Minute, "the change heard", func() error {
		if got := w.of(cart); len(got) != 1 || len(got[0].Endpoints) != 12 || !got[0].Silent.IsZero() {
			return fmt.Errorf("heard %v", got)
		}
		return nil
	})
}

// TestPublishesFollowEachOtherFast: a member whose watch runs reads its
// own chunks from the watch's cache, which may not show its last write
// yet. Publishes one right after another (2,500 endpoints, 12, 2,500, 12,
// then 2,500 and the 12 again: a flapping Deployment) leave the hub with
// the last one, and no chunk past it.
func TestPublishesFollowEachOtherFast(t *testing.T) {
	h := startHub(t)
	set := h.clusterset(t, "set")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := h.registry(t, set, "flap", hub.Options{})
	watch(t, ctx, r) // its own watch: Publish reads the cache now
	big, small := registrytest.Export(set, "flap", 625), registrytest.Export(set, "flap", 3)
	for _, e := range []registry.Export{big, small, big, small, big, small} {
		harness.Must(t, r.Publish(ctx, e))
	}
	held, err := r.Held(ctx, cart)
	harness.Must(t, err)
	if len(held) != 1 {
		t.Fatalf("the hub holds %d chunks of 12 endpoints, want 1", len(held))
	}
	for _, o := range held {
		if len(o.Spec.Endpoints) != 12 {
			t.Fatalf("the hub holds %d endpoints, want the last publish's 12", len(o.Spec.Endpoints))
		}
	}
	// Back and forth again, ending on the large one.
	for _, e := range []registry.Export{big, small, big} {
		harness.Must(t, r.Publish(ctx, e))
	}
	if held, _ = r.Held(ctx, cart); len(held) != 4 {
		t.Fatalf("the hub holds %d chunks of 2,500 endpoints, want 4", len(held))
	}
}

// BenchmarkResync: a watch started against a hub holding 1,000 services of
// one member (a restarted controller) syncs from one list, with no read
// per service.
func BenchmarkResync(b *testing.B) {
	ctrllog.SetLogger(harness.HeldLog(b))
	env := harness.Clusters(b, 1)
	admin := env.Clusters[0].Config
	ctx := context.Background()
	set := "bench"
	if err := hub.Init(ctx, admin, set); err != nil {
		b.Fatal(err)
	}
	r, err := hub.New(admin, hub.Options{ClusterSet: set, Cluster: "exporter"})
	if err != nil {
		b.Fatal(err)
	}
	const services = 1000
	for i := range services {
		e := registrytest.Export(set, "exporter", 5)
		e.Name = fmt.Sprintf("svc-%04d", i)
		if err := r.Publish(ctx, e); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithCancel(ctx)
		start := time.Now()
		told := 0
		synced := make(chan struct{})
		reader, err := hub.New(admin, hub.Options{ClusterSet: set, Cluster: "reader"})
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			_ = reader.Watch(ctx, registry.SinkFuncs{OnSet: func(registry.Key, []registry.Export) { told++ }, OnSynced: func() { close(synced) }})
		}()
		<-synced
		took := time.Since(start)
		cancel()
		if told != services {
			b.Fatalf("told %d services at sync, want %d", told, services)
		}
		b.ReportMetric(took.Seconds(), "s/resync")
		b.Logf("resync of %d services x 20 endpoints: %v", services, took)
	}
}

// TestForgetMember: forget-cluster on a hub refuses a member that proved
// alive, and for one gone deletes its exports (every watcher drops them),
// its Lease and its access. The TTL passed is 2 s here, not the shipped
// 2 min, so that the member is past it within the test.
func TestForgetMember(t *testing.T) {
	h := startHub(t)
	set := h.clusterset(t, "set")
	ctx := context.Background()
	w := watch(t, ctx, h.registry(t, set, "reader", hub.Options{}))
	goneCfg := h.member(t, set, "gone")
	gone, err := hub.New(goneCfg, hub.Options{ClusterSet: set, Cluster: "gone"})
	harness.Must(t, err)
	harness.Must(t, gone.Publish(ctx, registrytest.Export(set, "gone", 2)))
	beat, stop := context.WithCancel(ctx)
	go gone.Heartbeat(beat)
	harness.Eventually(t, 30*time.Second, "the export and the Lease", func() error {
		if len(w.of(cart)) != 1 {
			return fmt.Errorf("export not heard")
		}
		return h.adminClient(t).Get(ctx, client.ObjectKey{Namespace: hub.Namespace(set), Name: hub.LeaseName("gone")}, &coordinationv1.Lease{})
	})
	if _, err := hub.Forget(ctx, h.admin, set, "gone", time.Minute, false); err == nil || !strings.Contains(err.Error(), "proved alive") {
		t.Fatalf("forgetting a live member: %v", err)
	}
	stop()
	time.Sleep(3 * time.Second)
	n, err := hub.Forget(ctx, h.admin, set, "gone", 2*time.Second, false)
	harness.Must(t, err)
	if n != 1 {
		t.Errorf("%d ClusterExports deleted, want 1", n)
	}
	harness.Eventually(t, 30*time.Second, "the export dropped", func() error {
		if got := w.of(cart); len(got) != 0 {
			return fmt.Errorf("still heard: %d exports", len(got))
		}
		return nil
	})
	harness.Eventually(t, 30*time.Second, "the member's access gone", func() error {
		err := gone.Publish(ctx, registrytest.Export(set, "gone", 1))
		if err == nil || !strings.Contains(err.Error(), "Unauthorized") {
			return fmt.Errorf("publish after forget: %v", err)
		}
		return nil
	})
}

func (h *hubEnv) adminClient(t *testing.T) client.Client {
	c := harness.ClientWith(t, h.admin, hub.Scheme())
	return c
}

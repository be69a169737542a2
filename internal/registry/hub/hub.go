// Package hub is a Registry held by a hub Kubernetes cluster's API server:
// for clustersets outside AWS, or that would rather not depend on Cloud
// Map. Each member writes its exports as ClusterExport objects (chunks of
// at most 1,000 endpoints) in its clusterset's namespace on the hub, and
// proves it is alive with a Lease there; every member watches both, from
// the hub's watch cache, and never polls. The hub's admission policy
// (Init installs it) binds each object to the member it names.
package hub

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hubv1alpha1 "github.com/clustermap/clustermap/api/hub/v1alpha1"
	"github.com/clustermap/clustermap/internal/registry"
)

// DefaultHeartbeat is how often a member renews its Lease.
const DefaultHeartbeat = 30 * time.Second

// DefaultSilentAfter is how long a member's Lease may stand still while
// others move before its exports are drained: four heartbeats, as with
// Cloud Map (--silent-cluster-ttl).
const DefaultSilentAfter = 4 * DefaultHeartbeat

// fieldOwner is clustermap's field manager on the hub.
const fieldOwner = "clustermap"

// Options of one member's hub registry.
type Options struct {
	ClusterSet, Cluster string
	// Namespace is the clusterset's namespace on the hub (Namespace of the
	// clusterset when empty).
	Namespace string
	// Heartbeat spaces the renewals of this member's Lease; SilentAfter
	// drains a member whose Lease stood still that long while another's
	// moved (<0: never; 0: the defaults).
	Heartbeat, SilentAfter time.Duration
	// MaxImportEndpoints caps each cluster's endpoints of a service (0:
	// registry.DefaultMaxImportEndpoints).
	MaxImportEndpoints int
	// Observer, when set, hears a member drained or restored, how reaching
	// the hub went (at each renewal of this member's Lease, and at each
	// failed watch), and every member's last proof of life and who is
	// drained, after each judgement that changed it.
	Observer registry.Observer
	Log      logr.Logger
}

// Namespace is the hub namespace of a clusterset: clusterset-<id> when
// that is a DNS label, else named by a digest of the id.
func Namespace(clusterSet string) string {
	if n := "clusterset-" + clusterSet; len(validation.IsDNS1123Label(n)) == 0 {
		return n
	}
	sum := sha256.Sum256([]byte(clusterSet))
	return "clusterset-" + hex.EncodeToString(sum[:])[:16]
}

// LeaseName is a member's Lease on the hub.
func LeaseName(cluster string) string { return memberPrefix + cluster }

// Scheme holds the hub's types this package reads and writes: the
// built-in ones and ClusterExport.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s) // static registrations: cannot fail
	_ = hubv1alpha1.AddToScheme(s)    // as above
	return s
}

// Registry is one member's view of the hub.
type Registry struct {
	cfg *rest.Config
	c   client.Client
	o   Options
	ns  string

	mu sync.Mutex
	// synced is set once the watch's caches have synced: Check answers only
	// after that, and Publish reads this member's chunks from view (no
	// call to the hub) while the watch runs.
	synced bool
	view   client.Reader
	// wrote is this member's last whole write of each export: its
	// revision and chunk count. The cache may not show it yet.
	wrote map[registry.Key]written
	// dirty holds the services to tell the watch's sink of; wake wakes it.
	dirty map[registry.Key]bool
	wake  chan struct{}
	// regions is each member's Region as the hub's admin named it
	// (LabelRegion); moved the members whose Region changed since the
	// watch last told of their exports.
	regions map[string]string
	moved   map[string]bool
}

var _ registry.Located = (*Registry)(nil)

// Region is the Region the hub's admin named for this member (none: the
// clusterset is taken as one Region).
func (r *Registry) Region() string { return r.regionOf(r.o.Cluster) }

func (r *Registry) regionOf(cluster string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.regions[cluster]
}

// setRegion records a member's Region; a change is told with its exports.
func (r *Registry) setRegion(cluster, region string) {
	r.mu.Lock()
	if r.regions == nil {
		r.regions = map[string]string{}
	}
	changed := r.regions[cluster] != region
	r.regions[cluster] = region
	if changed {
		if r.moved == nil {
			r.moved = map[string]bool{}
		}
		r.moved[cluster] = true
	}
	r.mu.Unlock()
	if changed {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

var _ registry.Registry = (*Registry)(nil)

// DefaultQPS and DefaultBurst are a member's calls to the hub, where its
// kubeconfig sets none (hub join's does not): client-go's own 5 a second
// would take 200 s to write a new member's 1,000 Services; at 20, a
// fleet of 50 members writing at once asks 1,000 a second at most, which
// the hub's API Priority and Fairness queues.
const (
	DefaultQPS   = 20
	DefaultBurst = 40
)

// New makes cluster's registry on the hub that cfg reaches.
func New(cfg *rest.Config, o Options) (*Registry, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = DefaultQPS, DefaultBurst
	}
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, fmt.Errorf("hub client: %w", err)
	}
	if o.Namespace == "" {
		o.Namespace = Namespace(o.ClusterSet)
	}
	if o.Observer == nil {
		o.Observer = registry.ObserverFuncs{}
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.SilentAfter == 0 {
		o.SilentAfter = DefaultSilentAfter
	}
	if o.MaxImportEndpoints <= 0 {
		o.MaxImportEndpoints = registry.DefaultMaxImportEndpoints
	}
	return &Registry{cfg: cfg, c: c, o: o, ns: o.Namespace, dirty: map[registry.Key]bool{}, wake: make(chan struct{}, 1), wrote: map[registry.Key]written{}}, nil
}

// written is a whole write of an export: each chunk's revision, by chunk.
type written []string

// Publish makes the hub hold e as this member's export: the chunks whose
// revision differs are applied, every other chunk before the head, then
// chunks past the new count are deleted. A hub that cannot be reached
// fails the publish; what it wrote before failing is named by no head
// yet, so readers keep the export they had.
func (r *Registry) Publish(ctx context.Context, e registry.Export) error {
	if e.Cluster != r.o.Cluster || e.ClusterSet != r.o.ClusterSet {
		return fmt.Errorf("export of %s by cluster %q of %q published as cluster %q of %q", e.Key, e.Cluster, e.ClusterSet, r.o.Cluster, r.o.ClusterSet)
	}
	want, err := chunks(r.ns, e)
	if err != nil {
		return err
	}
	held, err := r.held(ctx, e.Key, false)
	if err != nil {
		return err
	}
	r.mu.Lock()
	last, wrote := r.wrote[e.Key]
	r.mu.Unlock()
	for _, o := range append(want[1:], want[0]) {
		// What the hub holds at this revision stands, unless this member
		// wrote another since (which the cache may not show yet).
		rev := o.Spec.Revision
		if h := held[o.Name]; h != nil && h.Spec.Revision == rev && (!wrote || int(o.Spec.Chunk) < len(last) && last[o.Spec.Chunk] == rev) {
			continue
		}
		if err := r.c.Patch(ctx, o, client.Apply, client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("writing %s/%s on the hub: %w", r.ns, o.Name, err)
		}
	}
	past := len(last)
	for _, h := range held {
		past = max(past, int(h.Spec.Chunk)+1)
	}
	for chunk := len(want); chunk < past; chunk++ {
		stale := &hubv1alpha1.ClusterExport{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: objectName(r.o.Cluster, e.Key, chunk)}}
		if err := client.IgnoreNotFound(r.c.Delete(ctx, stale)); err != nil {
			return fmt.Errorf("deleting %s/%s on the hub: %w", r.ns, stale.Name, err)
		}
	}
	now := make(written, len(want))
	for i, o := range want {
		now[i] = o.Spec.Revision
	}
	r.mu.Lock()
	r.wrote[e.Key] = now
	r.mu.Unlock()
	return nil
}

// Withdraw deletes this member's chunks of a service, the head first (a
// reader then sees no export, never a part of one).
func (r *Registry) Withdraw(ctx context.Context, key registry.Key) error {
	held, err := r.held(ctx, key, true)
	if err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.wrote, key)
	r.mu.Unlock()
	if h := held[objectName(r.o.Cluster, key, 0)]; h != nil {
		if err := client.IgnoreNotFound(r.c.Delete(ctx, h)); err != nil {
			return fmt.Errorf("deleting %s/%s on the hub: %w", r.ns, h.Name, err)
		}
	}
	for name, h := range held {
		if name == objectName(r.o.Cluster, key, 0) {
			continue // gone above
		}
		if err := client.IgnoreNotFound(r.c.Delete(ctx, h)); err != nil {
			return fmt.Errorf("deleting %s/%s on the hub: %w", r.ns, h.Name, err)
		}
	}
	return nil
}

// held reads this member's chunks of a service, by name: from the watch's
// cache while it runs (a read of the service's index, no call), else, or
// fromHub, from the hub (a list the hub filters from its whole
// namespace). The cache may not show this member's last writes yet
// (Publish knows them); a withdrawal reads the hub, which does.
func (r *Registry) held(ctx context.Context, key registry.Key, fromHub bool) (map[string]*hubv1alpha1.ClusterExport, error) {
	r.mu.Lock()
	view := r.view
	r.mu.Unlock()
	list := &hubv1alpha1.ClusterExportList{}
	if view != nil && !fromHub {
		if err := view.List(ctx, list, client.MatchingFields{serviceIndex: key.String()}); err != nil {
			return nil, fmt.Errorf("reading this cluster's exports of %s from the hub's cache: %w", key, err)
		}
		held := map[string]*hubv1alpha1.ClusterExport{}
		for i := range list.Items {
			if o := &list.Items[i]; o.Spec.Cluster == r.o.Cluster && o.Name == objectName(r.o.Cluster, key, int(o.Spec.Chunk)) {
				held[o.Name] = o
			}
		}
		return held, nil
	}
	if err := r.c.List(ctx, list, client.InNamespace(r.ns), client.MatchingLabels{hubv1alpha1.ClusterLabel: r.o.Cluster,
		hubv1alpha1.ServiceNamespaceLabel: key.Namespace, hubv1alpha1.ServiceNameLabel: key.Name}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("the hub has no ClusterExport type or namespace %s: run clustermap hub init on it: %w", r.ns, err)
		}
		return nil, fmt.Errorf("reading this cluster's exports of %s from the hub: %w", key, err)
	}
	held := map[string]*hubv1alpha1.ClusterExport{}
	for i := range list.Items {
		held[list.Items[i].Name] = &list.Items[i]
	}
	return held, nil
}

// Check tells the watch's sink what the hub holds of key: the watch cache
// is whole once synced, so what it lacks is exported nowhere.
func (r *Registry) Check(key registry.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.synced {
		r.markLocked(key)
	}
}

func (r *Registry) mark(key registry.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.markLocked(key)
}

func (r *Registry) markLocked(key registry.Key) {
	r.dirty[key] = true
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

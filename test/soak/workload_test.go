//go:build e2e

package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
)

// kind is what an item exercises: an MCS export, a replicated Service, or
// a Service registered in a Cloud Map DNS namespace.
type kind string

const (
	kindMCS kind = "m"
	kindSyn kind = "s"
	kindDNS kind = "d"
)

var kinds = []kind{kindMCS, kindSyn, kindDNS}

func (k kind) namespace() string {
	return map[kind]string{kindMCS: nsMCS, kindSyn: nsSyn, kindDNS: nsDNS}[k]
}

// item is one Service of the workload, by the cluster that publishes it.
type item struct {
	kind    kind
	cluster int
	name    string
}

func (it item) String() string {
	return fmt.Sprintf("%s/%s@%d", it.kind.namespace(), it.name, it.cluster)
}

// workload is the truth the counts are made against: what is published
// (live) and what was withdrawn (ended). An item leaves live before its
// withdrawal starts and enters it once published.
type workload struct {
	mu    sync.Mutex
	live  map[item]bool
	ended map[item]bool
	next  int
	nops  int
}

func newWorkload() *workload { return &workload{live: map[item]bool{}, ended: map[item]bool{}} }

func (w *workload) snapshot() []item { return w.items(w.live) }

func (w *workload) endedItems() []item { return w.items(w.ended) }

// items lists one of the sets, by name.
func (w *workload) items(set map[item]bool) []item {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []item
	for it := range set {
		out = append(out, it)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func (w *workload) ops() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nops
}

func (w *workload) newItem(k kind, cluster int) item {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	return item{kind: k, cluster: cluster, name: fmt.Sprintf("%s%d-%d", k, cluster, w.next)}
}

func (f *fleet) populate(t *testing.T) {
	for ci := range f.clients {
		for _, k := range f.kinds {
			n := map[kind]int{kindMCS: f.s.mcs, kindSyn: f.s.syn, kindDNS: f.s.dns}[k]
			for range n {
				harness.Must(t, f.publish(f.w.newItem(k, ci), 2))
			}
		}
	}
}

// publish creates an item's Deployment and Service, and for MCS its
// ServiceExport: the object that publishes it comes last, and the item is
// live once that succeeded.
func (f *fleet) publish(it item, replicas int32) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, ns := f.clients[it.cluster], it.kind.namespace()
	labels := map[string]string{"app": it.name}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: it.name},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: it.name},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	if it.kind == kindDNS {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
		svc.Annotations = map[string]string{cloudmapdns.AnnotationNamespace: dnsNamespace, cloudmapdns.AnnotationHostname: it.name}
	}
	objs := []client.Object{dep, svc}
	if it.kind == kindMCS {
		objs = append(objs, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: it.name}})
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			return fmt.Errorf("publishing %s: %w", it, err)
		}
	}
	f.w.mu.Lock()
	f.w.live[it] = true
	f.w.mu.Unlock()
	return nil
}

// withdraw deletes the publishing object first; the item is ended once
// that succeeded (and live again if it failed).
func (f *fleet) withdraw(it item) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.w.mu.Lock()
	delete(f.w.live, it)
	f.w.mu.Unlock()
	cl, ns := f.clients[it.cluster], it.kind.namespace()
	meta := metav1.ObjectMeta{Namespace: ns, Name: it.name}
	objs := []client.Object{&corev1.Service{ObjectMeta: meta}, &appsv1.Deployment{ObjectMeta: meta}}
	if it.kind == kindMCS {
		objs = append([]client.Object{&mcsv1beta1.ServiceExport{ObjectMeta: meta}}, objs...)
	}
	for i, o := range objs {
		if err := cl.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			if i == 0 {
				f.w.mu.Lock()
				f.w.live[it] = true
				f.w.mu.Unlock()
			}
			return err
		}
		if i == 0 {
			f.w.mu.Lock()
			f.w.ended[it] = true
			f.w.mu.Unlock()
		}
	}
	return nil
}

// churn, until stopped and in the clusters that are up: pods scale every
// churnEvery; every exportEvery an item is withdrawn or a new one
// published. The returned func stops it and waits.
func (f *fleet) churn(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pods, exports := time.NewTicker(f.s.churnEvery), time.NewTicker(f.s.exportEvery)
		defer pods.Stop()
		defer exports.Stop()
		for {
			var lifecycle bool
			select {
			case <-ctx.Done():
				return
			case <-pods.C:
			case <-exports.C:
				lifecycle = true
			}
			live := f.w.snapshot()
			if len(live) == 0 {
				continue
			}
			it := live[rand.IntN(len(live))]
			if f.isDown(it.cluster) {
				continue
			}
			var err error
			switch {
			case !lifecycle:
				err = f.scale(it, int32(1+rand.IntN(3)))
			case rand.IntN(2) == 0 && !last(live, it):
				err = f.withdraw(it)
			default:
				err = f.publish(f.w.newItem(f.kinds[rand.IntN(len(f.kinds))], it.cluster), int32(1+rand.IntN(3)))
			}
			if err != nil {
				t.Logf("churn (cluster %d may be restarting): %v", it.cluster, err)
			}
			f.w.mu.Lock()
			f.w.nops++
			f.w.mu.Unlock()
		}
	}()
	return func() { cancel(); <-done }
}

// last says it is the only live item of its kind in its cluster. The
// churn keeps it: a cluster that exports nothing while another's
// controller restarts makes that controller hold its removals, as the
// safety design wants (RemovalHeld: more likely a misconfiguration than
// every export gone at once), which a campaign of faults is not about.
func last(live []item, it item) bool {
	for _, o := range live {
		if o != it && o.kind == it.kind && o.cluster == it.cluster {
			return false
		}
	}
	return true
}

func (f *fleet) scale(it item, n int32) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: it.kind.namespace(), Name: it.name}}
	patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n))
	return f.clients[it.cluster].Patch(ctx, dep, patch)
}

// monitor watches, every second, that no import or replica that appeared
// disappears while its source is live; stop returns what did.
func (f *fleet) monitor(t *testing.T) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	seen := map[string]bool{}
	var lost []string
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			for j, cl := range f.clients {
				if f.isDown(j) {
					continue
				}
				present, err := importsAndReplicas(ctx, cl)
				if err != nil {
					continue // unreachable: a restart in progress
				}
				for _, it := range f.w.snapshot() { // after the reads: an item ended meanwhile is not live
					if it.cluster == j || it.kind == kindDNS {
						continue
					}
					key := fmt.Sprintf("%s in cluster %d", it, j)
					switch {
					case present[it.kind.namespace()+"/"+it.name]:
						seen[key] = true
					case seen[key]:
						lost = append(lost, key+" at "+time.Now().Format(time.TimeOnly))
						delete(seen, key)
					}
				}
			}
		}
	}()
	return func() []string {
		cancel()
		<-done
		if len(lost) > 0 {
			t.Logf("lost while live: %v", lost)
		}
		return lost
	}
}

// importsAndReplicas lists a cluster's ServiceImports and replicas, as
// namespace/name.
func importsAndReplicas(ctx context.Context, cl client.Client) (map[string]bool, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := map[string]bool{}
	imps := &mcsv1beta1.ServiceImportList{}
	if err := cl.List(rctx, imps, client.InNamespace(nsMCS)); err != nil {
		return nil, err
	}
	for _, si := range imps.Items {
		out[si.Namespace+"/"+si.Name] = true
	}
	svcs := &corev1.ServiceList{}
	if err := cl.List(rctx, svcs, client.InNamespace(nsSyn), client.HasLabels{replication.LabelSourceCluster}); err != nil {
		return nil, err
	}
	for _, s := range svcs.Items {
		out[s.Namespace+"/"+s.Name] = true
	}
	return out, nil
}

func createNamespace(cl client.Client, name string) error {
	err := cl.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

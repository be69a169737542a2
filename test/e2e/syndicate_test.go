//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
)

// TestSyndicate runs `controller --syndicate --mcs=false` in 3 clusters,
// each with the others' kubeconfigs in its peers directory.
func TestSyndicate(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 3}})
	for _, ns := range []string{"web", "mig", "ns-in", "ns-out", "private"} {
		w.allNamespaces(t, ns)
	}
	// Each controller reaches its peers with the access
	// `clustermap peer-kubeconfig` grants for the namespaces it replicates.
	dirs, err := w.env.PeerDirs(context.Background(), t.TempDir(), replication.PeerAccess{Namespaces: []string{"web", "mig", "ns-in"}})
	harness.Must(t, err)
	// Locally, the chart's ServiceAccount for this mode alone, without
	// namespace creation.
	asSA, configs := w.chartServiceAccount(t, loadChart(t), map[string]any{"mcs": map[string]any{"enabled": false}, "syndicate": map[string]any{"enabled": true}})
	checkAccess(t, configs[w.env.Clusters[0].Config.Host], []access{
		{authzv1.ResourceAttributes{Verb: "create", Resource: "namespaces"}, false},
		{authzv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: "web"}, false},
		{authzv1.ResourceAttributes{Verb: "create", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: "web"}, true},
	})
	t.Cleanup(w.startControllers(t, func(o *controller.Options) {
		w.asPeer(o, dirs) // before asSA: it finds the cluster by its admin config
		asSA(o)
		// No leader election: "peer down" stops a cluster's apiserver, and
		// its controller would lose its lease and exit (as it should),
		// ending the test's controllers.
		o.LeaderElect = false
		o.MCS, o.Syndicate, o.CreateNamespaces, o.PeerGrace = false, true, false, 3*time.Second
		o.Namespaces = []string{"web", "mig", "ns-in", "private"}
		o.ExcludeNamespaces = append(o.ExcludeNamespaces, "private")
	}))
	t.Run("replication, scaling, deletion", w.replicate)
	t.Run("a dual-stack Service", w.dualStackReplica)
	t.Run("name clash", w.nameClash)
	t.Run("namespaces", w.syndicateNamespaces)
	t.Run("stateful migration", w.statefulMigration)
	t.Run("stateless migration", w.unionMigration)
	t.Run("singular", w.singular)
	t.Run("peer down", w.peerDown)
	t.Run("peer removed", func(t *testing.T) { w.peerRemoved(t, dirs) })
}

// asPeer names the cluster a controller runs for by its id and gives it
// that cluster's peers directory (from PeerDirs), as syndicate needs.
func (w *world) asPeer(o *controller.Options, dirs map[string]string) {
	for _, c := range w.env.Clusters {
		if c.Config == o.Config {
			o.ClusterName, o.PeersDir = c.ID, dirs[c.ID]
		}
	}
}

// servedIPs is every ready address a cluster's EndpointSlices give a
// Service, whoever wrote them.
func servedIPs(cl client.Client, ns, name string) ([]string, error) {
	list := &discoveryv1.EndpointSliceList{}
	if err := cl.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return nil, err
	}
	ips := readyIPs(list.Items)
	return slices.Compact(ips), nil
}

// replicaOf checks a peer's copy: selector-less, labelled with its source,
// headless or not as the source, serving exactly ips.
func replicaOf(cl client.Client, ns, name, from string, headless bool, ips []string) func() error {
	return func() error {
		svc := &corev1.Service{}
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		switch {
		case len(svc.Spec.Selector) > 0:
			return fmt.Errorf("replica has a selector %v", svc.Spec.Selector)
		case svc.Labels[replication.LabelSourceCluster] != from:
			return fmt.Errorf("replica labelled %q, want %s", svc.Labels[replication.LabelSourceCluster], from)
		case (svc.Spec.ClusterIP == corev1.ClusterIPNone) != headless:
			return fmt.Errorf("replica clusterIP %s, headless %v wanted", svc.Spec.ClusterIP, headless)
		}
		return serves(cl, ns, name, ips)()
	}
}

func serves(cl client.Client, ns, name string, ips []string) func() error {
	return func() error {
		got, err := servedIPs(cl, ns, name)
		if err != nil {
			return err
		}
		if !slices.Equal(got, ips) {
			list := &discoveryv1.EndpointSliceList{}
			_ = cl.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name})
			var from []string
			for _, s := range list.Items {
				from = append(from, fmt.Sprintf("%s(%s %s %v)", s.Name, s.Labels[discoveryv1.LabelManagedBy], s.Labels[replication.LabelSourceCluster], readyIPs([]discoveryv1.EndpointSlice{s})))
			}
			return fmt.Errorf("%s/%s serves %v, want %v; slices %s", ns, name, got, ips, strings.Join(from, ", "))
		}
		return nil
	}
}

func gone(cl client.Client, ns, name string) func() error {
	return func() error {
		err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &corev1.Service{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("%s/%s still there (%v)", ns, name, err)
	}
}

func (w *world) replicate(t *testing.T) {
	src := w.clients[0]
	app(t, src, "web", "api", 3, false, httpPort(80, 8080))
	app(t, src, "web", "db", 2, true, httpPort(5432, 5432))
	for _, c := range []struct {
		name     string
		n        int
		headless bool
	}{{"api", 3, false}, {"db", 2, true}} {
		ips := waitPods(t, src, "web", c.name, c.n)
		for _, peer := range w.clients[1:] {
			harness.Eventually(t, importDeadline, "replica of "+c.name, replicaOf(peer, "web", c.name, "cluster-1", c.headless, ips))
		}
	}
	// The endpoints carry the target port.
	list := &discoveryv1.EndpointSliceList{}
	harness.Must(t, w.clients[1].List(context.Background(), list, client.InNamespace("web"), client.MatchingLabels{discoveryv1.LabelServiceName: "api", discoveryv1.LabelManagedBy: replication.ManagedBy}))
	if len(list.Items) != 1 || len(list.Items[0].Ports) != 1 || *list.Items[0].Ports[0].Port != 8080 || *list.Items[0].Ports[0].Name != "http" {
		t.Fatalf("replica slices %+v, want one with port http 8080", list.Items)
	}
	for _, n := range []int32{5, 1} {
		harness.Scale(t, src, "web", "api", n)
		ips := waitPods(t, src, "web", "api", int(n))
		start := time.Now()
		for _, peer := range w.clients[1:] {
			// How soon is a number printed here (and measured in bench/), not
			// a deadline: a loaded machine must not fail it.
			harness.Eventually(t, importDeadline, fmt.Sprintf("scale to %d reflected", n), serves(peer, "web", "api", ips))
		}
		t.Logf("scale to %d: peers serve the new pods %v after the source's EndpointSlice", n, time.Since(start).Round(time.Millisecond))
	}
	harness.Must(t, src.Delete(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "api"}}))
	for _, peer := range w.clients[1:] {
		harness.Eventually(t, importDeadline, "replica removed", gone(peer, "web", "api"))
	}
}

// nameClash: a peer's own Service of the same name is left alone.
func (w *world) nameClash(t *testing.T) {
	// cluster-3's own Service, kept to itself (singular) from its creation,
	// is not replicated. (Made singular after, it could be replicated in
	// the moment before, and that replica could appear after a check that
	// none is there.)
	harness.CreateApp(t, w.clients[2], harness.App{Namespace: "web", Name: "clash", Replicas: 1, Ports: []corev1.ServicePort{httpPort(80, 8080)},
		Shape: func(s *corev1.Service) {
			metav1.SetMetaDataAnnotation(&s.ObjectMeta, replication.AnnotationMode, string(replication.ModeSingular))
		}})
	for _, cl := range w.clients[:2] {
		harness.Eventually(t, importDeadline, "no replica of a singular Service", gone(cl, "web", "clash"))
	}
	own := waitPods(t, w.clients[2], "web", "clash", 1)
	app(t, w.clients[0], "web", "clash", 2, false, httpPort(80, 8080))
	ips := waitPods(t, w.clients[0], "web", "clash", 2)
	harness.Eventually(t, importDeadline, "replicated where there is no clash", replicaOf(w.clients[1], "web", "clash", "cluster-1", false, ips))
	harness.Eventually(t, 5*time.Second, "NameClash Event", wantEvent(w.clients[0], "web", "clash", "NameClash", corev1.EventTypeWarning, "cluster-3 has its own Service web/clash"))
	svc := &corev1.Service{}
	harness.Must(t, w.clients[2].Get(context.Background(), client.ObjectKey{Namespace: "web", Name: "clash"}, svc))
	if svc.Spec.Selector["app"] != "clash" || svc.Labels[replication.LabelSourceCluster] != "" {
		t.Errorf("the peer's own Service was changed: %+v", svc)
	}
	harness.Must(t, serves(w.clients[2], "web", "clash", own)())
}

func (w *world) syndicateNamespaces(t *testing.T) {
	for _, ns := range []string{"ns-in", "ns-out", "private"} {
		app(t, w.clients[0], ns, "app", 1, false, httpPort(80, 8080))
	}
	ips := waitPods(t, w.clients[0], "ns-in", "app", 1)
	harness.Eventually(t, importDeadline, "watched namespace replicated", replicaOf(w.clients[1], "ns-in", "app", "cluster-1", false, ips))
	time.Sleep(2 * time.Second)
	for _, ns := range []string{"ns-out", "private"} {
		for _, peer := range w.clients[1:] {
			if err := gone(peer, ns, "app")(); err != nil {
				t.Errorf("not watched or excluded namespace %s replicated: %v", ns, err)
			}
		}
	}
}

// noGap samples every cluster's endpoints of a Service until stopped and
// reports any moment a cluster served none.
func (w *world) noGap(t *testing.T, ns, name string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var gaps []string
	samples := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for i, cl := range w.clients {
				if ips, err := servedIPs(cl, ns, name); err == nil && len(ips) == 0 {
					mu.Lock()
					gaps = append(gaps, fmt.Sprintf("cluster-%d at %s", i+1, time.Now().Format("15:04:05.000")))
					mu.Unlock()
				}
			}
			samples++
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		t.Logf("%s/%s: %d samples of all 3 clusters", ns, name, samples)
		if len(gaps) > 0 {
			t.Errorf("%s/%s had no ready endpoints: %s", ns, name, strings.Join(gaps[:min(len(gaps), 10)], ", "))
		}
	}
}

func setMode(t *testing.T, cl client.Client, ns, name string, m replication.Mode) {
	t.Helper()
	updateService(t, cl, ns, name, func(s *corev1.Service) {
		metav1.SetMetaDataAnnotation(&s.ObjectMeta, replication.AnnotationMode, string(m))
	})
}

func updateService(t *testing.T, cl client.Client, ns, name string, change func(*corev1.Service)) {
	t.Helper()
	harness.Must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s := &corev1.Service{}
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, s); err != nil {
			return err
		}
		change(s)
		return cl.Update(context.Background(), s)
	}))
}

// deploy creates a Deployment only, its pods labelled labels.
func deploy(t *testing.T, cl client.Client, ns, name string, replicas int32, labels map[string]string) {
	t.Helper()
	harness.Must(t, cl.Create(context.Background(), &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}},
		},
	}))
}

func podIPs(t *testing.T, cl client.Client, ns string, labels map[string]string, n int) []string {
	t.Helper()
	var ips []string
	harness.Eventually(t, 30*time.Second, fmt.Sprintf("%d ready pods %v", n, labels), func() error {
		pods := &corev1.PodList{}
		if err := cl.List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
			return err
		}
		ips = nil
		for _, p := range pods.Items {
			if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						ips = append(ips, p.Status.PodIP)
					}
				}
			}
		}
		if len(ips) != n {
			return fmt.Errorf("%d ready", len(ips))
		}
		return nil
	})
	sort.Strings(ips)
	return ips
}

func allServe(t *testing.T, w *world, step, ns, name string, ips []string) {
	t.Helper()
	for i, cl := range w.clients {
		harness.Eventually(t, importDeadline, fmt.Sprintf("%s: cluster-%d", step, i+1), serves(cl, ns, name, ips))
	}
}

// migrationStart deploys name (2 pods) in cluster-1, served everywhere, and
// Deployment newName (2 pods labelled newLabels) in cluster-2; it returns
// both sets of addresses and starts the gap sampler on name.
func (w *world) migrationStart(t *testing.T, name, newName string, newLabels map[string]string) (old, fresh []string, stop func()) {
	t.Helper()
	app(t, w.clients[0], "mig", name, 2, false, httpPort(80, 8080))
	old = waitPods(t, w.clients[0], "mig", name, 2)
	allServe(t, w, "before", "mig", name, old)
	deploy(t, w.clients[1], "mig", newName, 2, newLabels)
	fresh = podIPs(t, w.clients[1], "mig", newLabels, 2)
	return old, fresh, w.noGap(t, "mig", name)
}

// statefulMigration follows the seed: new pods in the target, `receiver` on
// the source, then the right selector on the target.
func (w *world) statefulMigration(t *testing.T) {
	a, b := w.clients[0], w.clients[1]
	// The new pods in the target cluster: not yet serving.
	old, fresh, stop := w.migrationStart(t, "stateful", "stateful-new", map[string]string{"app": "stateful-new"})
	defer stop()

	setMode(t, a, "mig", "stateful", replication.ModeReceiver)
	harness.Eventually(t, importDeadline, "the target is the source", func() error {
		s := &corev1.Service{}
		if err := b.Get(context.Background(), client.ObjectKey{Namespace: "mig", Name: "stateful"}, s); err != nil {
			return err
		}
		if replication.ModeOf(s) != replication.ModeSource || s.Labels[replication.LabelSourceCluster] != "" {
			return fmt.Errorf("target Service mode %q labels %v", replication.ModeOf(s), s.Labels)
		}
		src := &corev1.Service{}
		if err := a.Get(context.Background(), client.ObjectKey{Namespace: "mig", Name: "stateful"}, src); err != nil {
			return err
		}
		if len(src.Spec.Selector) > 0 {
			return fmt.Errorf("old source keeps its selector %v", src.Spec.Selector)
		}
		return nil
	})
	allServe(t, w, "after receiver", "mig", "stateful", old)

	updateService(t, b, "mig", "stateful", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "stateful-new"} })
	allServe(t, w, "after the target's selector", "mig", "stateful", fresh)
	harness.Eventually(t, importDeadline, "the old source is now a receiver of the new", func() error {
		list := &discoveryv1.EndpointSliceList{}
		if err := a.List(context.Background(), list, client.InNamespace("mig"), client.MatchingLabels{discoveryv1.LabelServiceName: "stateful"}); err != nil {
			return err
		}
		for _, s := range list.Items {
			if s.Labels[replication.LabelSourceCluster] != "cluster-2" {
				return fmt.Errorf("slice %s from %q left", s.Name, s.Labels[replication.LabelSourceCluster])
			}
		}
		return nil
	})
}

// unionMigration follows the seed: new pods in the target, `union` on the
// source (both serve old and new), `source` on the target, then its selector.
func (w *world) unionMigration(t *testing.T) {
	a, b := w.clients[0], w.clients[1]
	// The new pods carry the source's labels.
	old, fresh, stop := w.migrationStart(t, "stateless", "stateless-b", map[string]string{"app": "stateless"})
	defer stop()

	setMode(t, a, "mig", "stateless", replication.ModeUnion)
	union := slices.Sorted(slices.Values(append(slices.Clone(old), fresh...)))
	allServe(t, w, "after union", "mig", "stateless", union)

	setMode(t, b, "mig", "stateless", replication.ModeSource)
	harness.Eventually(t, importDeadline, "the old source is a receiver", func() error {
		s := &corev1.Service{}
		if err := a.Get(context.Background(), client.ObjectKey{Namespace: "mig", Name: "stateless"}, s); err != nil {
			return err
		}
		if m := replication.ModeOf(s); m != replication.ModeReceiver {
			return fmt.Errorf("mode %q", m)
		}
		return nil
	})
	allServe(t, w, "after source on the target", "mig", "stateless", fresh)

	updateService(t, b, "mig", "stateless", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "stateless"} })
	allServe(t, w, "after the target's selector", "mig", "stateless", fresh)
}

// singular, both ways: set on a replica, set on the source, and a Service
// created singular.
func (w *world) singular(t *testing.T) {
	src := w.clients[0]
	for _, name := range []string{"s1", "s2"} {
		app(t, src, "web", name, 1, false, httpPort(80, 8080))
		ips := waitPods(t, src, "web", name, 1)
		for _, peer := range w.clients[1:] {
			harness.Eventually(t, importDeadline, "replica of "+name, replicaOf(peer, "web", name, "cluster-1", false, ips))
		}
	}
	setMode(t, w.clients[1], "web", "s1", replication.ModeSingular)
	setMode(t, src, "web", "s2", replication.ModeSingular)
	for _, name := range []string{"s1", "s2"} {
		for _, peer := range w.clients[1:] {
			harness.Eventually(t, importDeadline, "replicas of "+name+" removed", gone(peer, "web", name))
		}
	}
	s := &corev1.Service{}
	harness.Must(t, src.Get(context.Background(), client.ObjectKey{Namespace: "web", Name: "s1"}, s))
	if replication.ModeOf(s) != replication.ModeSingular {
		t.Errorf("singular on the replica did not reach the source: mode %q", replication.ModeOf(s))
	}
	harness.Must(t, serves(src, "web", "s1", waitPods(t, src, "web", "s1", 1))())
	// Created singular: never replicated.
	harness.Must(t, src.Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "s3",
		Annotations: map[string]string{replication.AnnotationModeAlias: "singular"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "s1"}, Ports: []corev1.ServicePort{httpPort(80, 8080)}}}))
	time.Sleep(2 * time.Second)
	for _, peer := range w.clients[1:] {
		if err := gone(peer, "web", "s3")(); err != nil {
			t.Errorf("a Service created singular was replicated: %v", err)
		}
	}
}

// peerDown: cluster-2 stopped for 30 s. Its replicas elsewhere and the
// replicas in it stay; a change made meanwhile reaches it once it is back.
func (w *world) peerDown(t *testing.T) {
	ctx := context.Background()
	one, two, three := w.clients[0], w.clients[1], w.clients[2]
	app(t, one, "web", "from1", 2, false, httpPort(80, 8080))
	app(t, two, "web", "from2", 2, false, httpPort(80, 8080))
	ips1, ips2 := waitPods(t, one, "web", "from1", 2), waitPods(t, two, "web", "from2", 2)
	harness.Eventually(t, importDeadline, "from1 in cluster-2", replicaOf(two, "web", "from1", "cluster-1", false, ips1))
	for _, cl := range []client.Client{one, three} {
		harness.Eventually(t, importDeadline, "from2 replicated", replicaOf(cl, "web", "from2", "cluster-2", false, ips2))
	}
	harness.Must(t, w.env.StopCluster(ctx, w.env.Clusters[1]))
	stopped := time.Now()
	harness.Scale(t, one, "web", "from1", 3)
	ips1 = waitPods(t, one, "web", "from1", 3)
	harness.Eventually(t, importDeadline, "cluster-3 follows while cluster-2 is down", replicaOf(three, "web", "from1", "cluster-1", false, ips1))
	for time.Since(stopped) < 30*time.Second {
		for _, cl := range []client.Client{one, three} {
			harness.Must(t, replicaOf(cl, "web", "from2", "cluster-2", false, ips2)())
		}
		time.Sleep(2 * time.Second)
	}
	harness.Must(t, w.env.StartCluster(ctx, w.env.Clusters[1]))
	harness.Eventually(t, 60*time.Second, "cluster-2 converges once back", replicaOf(two, "web", "from1", "cluster-1", false, ips1))
	for _, cl := range []client.Client{one, three} {
		harness.Must(t, replicaOf(cl, "web", "from2", "cluster-2", false, ips2)())
	}
}

// peerRemoved: cluster-1 and cluster-3 drop each other from their peers
// directories; after the grace period each has removed the other's replicas,
// while cluster-2 keeps both.
func (w *world) peerRemoved(t *testing.T, dirs map[string]string) {
	one, two, three := w.clients[0], w.clients[1], w.clients[2]
	app(t, three, "web", "from3", 1, false, httpPort(80, 8080))
	ips3 := waitPods(t, three, "web", "from3", 1)
	harness.Eventually(t, importDeadline, "from3 in cluster-1", replicaOf(one, "web", "from3", "cluster-3", false, ips3))
	harness.Must(t, os.Remove(filepath.Join(dirs["cluster-1"], "cluster-3.yaml")))
	harness.Must(t, os.Remove(filepath.Join(dirs["cluster-3"], "cluster-1.yaml")))
	removed := time.Now()
	harness.Eventually(t, 30*time.Second, "cluster-3's replica gone from cluster-1", gone(one, "web", "from3"))
	harness.Eventually(t, 30*time.Second, "cluster-1's replica gone from cluster-3", gone(three, "web", "from1"))
	if d := time.Since(removed); d < 3*time.Second {
		t.Errorf("replicas removed %v after the peer, before the 3 s grace period", d)
	}
	harness.Eventually(t, importDeadline, "cluster-2 keeps from3", replicaOf(two, "web", "from3", "cluster-3", false, ips3))
}

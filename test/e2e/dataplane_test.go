//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	"github.com/clustermap/clustermap/test/harness"
)

// onDataplane asks for a pod network and server on an app's pods.
var onDataplane = map[string]string{dataplane.Annotation: "true"}

// unexportBound is how long requests may go on succeeding after the last
// export of a service ends: the importing controller's poll (500 ms here),
// the import's removal, kube-proxy's resync of the derived Service (it
// batches changes for up to a second) and the DNS TTL (5 s) for new names.
const unexportBound = 20 * time.Second

// TestDataplane sends real requests between clusters: from a client pod
// in cluster-3, through its node's clusterset DNS and kube-proxy, over
// the routes between the clusters, to the pods' servers.
func TestDataplane(t *testing.T) {
	w := &world{env: harness.ClustersWith(t, devenv.Options{Clusters: 3, Dataplane: true}), cm: harness.CloudMap(t, cloudmaplocal.Options{})}
	w.connect(t)
	t.Cleanup(w.startControllers(t, nil))
	// Beside MCS, replication of one namespace between the same clusters.
	dirs, err := w.env.PeerDirs(t.TempDir())
	harness.Must(t, err)
	t.Cleanup(w.startControllers(t, func(o *controller.Options) {
		w.asPeer(o, dirs)
		o.MCS, o.Syndicate, o.CreateNamespaces, o.Namespaces = false, true, false, []string{"dp-syn"}
	}))
	const ns = "dp"
	for _, cl := range w.clients {
		namespace(t, cl, ns)
		namespace(t, cl, "dp-syn")
	}
	d := &dpWorld{world: w, at: w.env.Clusters[2], client: clientPod(t, w, 2, ns)}
	t.Run("only exporting clusters answer, then both", d.exporters)
	t.Run("each port reaches the clusters exposing it", d.ports)
	t.Run("UDP reaches the exporting cluster", d.udp)
	t.Run("headless per-pod names reach their pods", d.headless)
	t.Run("an unexported Service is unreachable", d.unexported)
	t.Run("syndicate replicas carry traffic", d.replica)
}

// TestDataplaneIPv6Only: the same request between IPv6-only clusters.
func TestDataplaneIPv6Only(t *testing.T) {
	w := &world{env: harness.ClustersWith(t, devenv.Options{Clusters: 2, Dataplane: true, IPFamily: devenv.IPv6}), cm: harness.CloudMap(t, cloudmaplocal.Options{})}
	w.connect(t)
	t.Cleanup(w.startControllers(t, nil))
	const ns, name = "dp6", "web"
	for _, cl := range w.clients {
		namespace(t, cl, ns)
	}
	d := &dpWorld{world: w, at: w.env.Clusters[1], client: clientPod(t, w, 1, ns)}
	appWith(t, d.clients[0], ns, name, 2, false, onDataplane, httpPort(80, 8080))
	exportService(t, d.clients[0], ns, name)
	d.untilAnswered(t, name+"."+ns+".svc.clusterset.local", "cluster-1")
}

type dpWorld struct {
	*world
	// client is a client pod of cluster at, namespace/name.
	at     *devenv.Cluster
	client string
}

// clientPod starts a data plane pod in cluster i and returns it once its
// network is up.
func clientPod(t *testing.T, w *world, i int, ns string) string {
	t.Helper()
	appWith(t, w.clients[i], ns, "client", 1, false, onDataplane, httpPort(80, 80))
	var pod string
	harness.Eventually(t, time.Minute, "client pod with a network", func() error {
		pods := &corev1.PodList{}
		if err := w.clients[i].List(context.Background(), pods, client.InNamespace(ns), client.MatchingLabels{"app": "client"}); err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d client pods", len(pods.Items))
		}
		pod = ns + "/" + pods.Items[0].Name
		_, err := devenv.PodNetNS(w.env.StateDir, w.env.Clusters[i].ID, pod)
		return err
	})
	return pod
}

// ask sends one request from the client pod with curl and returns who
// answered.
func (d *dpWorld) ask(url string, curlArgs ...string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := append([]string{"curl", "-sS", "--max-time", "2"}, curlArgs...)
	out, err := d.env.PodExec(ctx, d.at, d.client, append(args, url)...)
	if err != nil {
		return nil, fmt.Errorf("curl %s: %v: %s", url, err, strings.TrimSpace(string(out)))
	}
	a := dataplane.ParseAnswer(string(out))
	if a["cluster"] == "" {
		return nil, fmt.Errorf("curl %s: not a pod server's answer: %q", url, out)
	}
	return a, nil
}

// answeringClusters asks n times and returns the clusters that answered.
func (d *dpWorld) answeringClusters(t *testing.T, n int, url string, curlArgs ...string) []string {
	t.Helper()
	seen := map[string]bool{}
	for range n {
		a, err := d.ask(url, curlArgs...)
		if err != nil {
			t.Fatal(err)
		}
		seen[a["cluster"]] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// untilAnswered waits until every cluster of want has answered url.
func (d *dpWorld) untilAnswered(t *testing.T, url string, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	harness.Eventually(t, time.Minute, "answers from "+strings.Join(want, ",")+" at "+url, func() error {
		a, err := d.ask(url)
		if err != nil {
			return err
		}
		if !slices.Contains(want, a["cluster"]) {
			t.Fatalf("%s answered from %s, which does not export it: %v", url, a["cluster"], a)
		}
		seen[a["cluster"]] = true
		for _, c := range want {
			if !seen[c] {
				return fmt.Errorf("no answer from %s yet (seen %v)", c, slices.Sorted(maps.Keys(seen)))
			}
		}
		return nil
	})
}

// untilPods waits until n distinct pods have answered url.
func (d *dpWorld) untilPods(t *testing.T, url string, n int) {
	t.Helper()
	seen := map[string]bool{}
	harness.Eventually(t, time.Minute, fmt.Sprintf("answers from %d pods at %s", n, url), func() error {
		a, err := d.ask(url)
		if err != nil {
			return err
		}
		seen[a["pod"]] = true
		if len(seen) < n {
			return fmt.Errorf("answers from %v", slices.Sorted(maps.Keys(seen)))
		}
		return nil
	})
}

func (d *dpWorld) exporters(t *testing.T) {
	const ns, name = "dp", "web"
	url := name + "." + ns + ".svc.clusterset.local"
	// The same Service in cluster-1 and cluster-2; only cluster-1 exports it.
	for _, cl := range d.clients[:2] {
		appWith(t, cl, ns, name, 2, false, onDataplane, httpPort(80, 8080))
		requireDualStack(t, cl, ns, name)
	}
	exportService(t, d.clients[0], ns, name)
	d.untilAnswered(t, url, "cluster-1")
	// Every pod's server listens before answers are counted: kwok makes a
	// pod Ready before its node has started the server.
	d.untilPods(t, url, 2)
	if got := d.answeringClusters(t, 20, url); !slices.Equal(got, []string{"cluster-1"}) {
		t.Fatalf("answers from %v, want cluster-1 only", got)
	}
	// Both families of the dual-stack clusterset IP.
	for _, fam := range []string{"-4", "-6"} {
		if a, err := d.ask(url, fam); err != nil || a["cluster"] != "cluster-1" {
			t.Errorf("curl %s %s: %v %v", fam, url, a, err)
		}
	}

	exportService(t, d.clients[1], ns, name)
	d.untilAnswered(t, url, "cluster-1", "cluster-2")

	start := time.Now()
	for _, cl := range d.clients[:2] {
		harness.Must(t, cl.Delete(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
	}
	harness.Eventually(t, unexportBound, "requests to an unexported service fail", func() error {
		if a, err := d.ask(url); err == nil {
			return fmt.Errorf("still answered by %v", a)
		}
		return nil
	})
	t.Logf("requests stopped %v after the exports ended", time.Since(start).Round(100*time.Millisecond))
}

// requireDualStack gives a Service an address of each family.
func requireDualStack(t *testing.T, cl client.Client, ns, name string) {
	t.Helper()
	svc := &corev1.Service{}
	harness.Must(t, cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc))
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc.Spec.IPFamilies = nil
	harness.Must(t, cl.Update(context.Background(), svc))
}

func (d *dpWorld) ports(t *testing.T) {
	const ns, name = "dp", "multi"
	url := name + "." + ns + ".svc.clusterset.local"
	metrics := corev1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromInt32(9090)}
	appWith(t, d.clients[0], ns, name, 1, false, onDataplane, httpPort(80, 8080))
	appWith(t, d.clients[1], ns, name, 1, false, onDataplane, httpPort(80, 8080), metrics)
	exportService(t, d.clients[0], ns, name)
	exportService(t, d.clients[1], ns, name)
	d.untilAnswered(t, url, "cluster-1", "cluster-2")
	d.untilAnswered(t, url+":9090", "cluster-2")
	if got := d.answeringClusters(t, 10, url+":9090"); !slices.Equal(got, []string{"cluster-2"}) {
		t.Fatalf("port 9090 answered from %v, want cluster-2 only", got)
	}
}

func (d *dpWorld) udp(t *testing.T) {
	const ns, name = "dp", "echo"
	appWith(t, d.clients[0], ns, name, 1, false, onDataplane,
		corev1.ServicePort{Name: "echo", Protocol: corev1.ProtocolUDP, Port: 5353, TargetPort: intstr.FromInt32(5353)})
	exportService(t, d.clients[0], ns, name)
	addr := name + "." + ns + ".svc.clusterset.local:5353"
	harness.Eventually(t, time.Minute, "a UDP answer from "+addr, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := d.env.PodExec(ctx, d.at, d.client, filepath.Join(d.env.BinDir, "clustermap-dev"), "udp", addr, "ping")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if a := dataplane.ParseAnswer(string(out)); a["cluster"] != "cluster-1" || a["port"] != "5353/UDP" || a["echo"] != "ping" {
			t.Fatalf("%s answered %q", addr, out)
		}
		return nil
	})
}

func (d *dpWorld) headless(t *testing.T) {
	const ns, name = "dp", "db"
	labels := map[string]string{"app": name}
	src := d.clients[0]
	harness.Must(t, src.Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels, Ports: []corev1.ServicePort{httpPort(80, 80)}}}))
	harness.Must(t, src.Create(context.Background(), &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), ServiceName: name, Selector: &metav1.LabelSelector{MatchLabels: labels},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: onDataplane},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "db", Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}}}}}))
	exportService(t, src, ns, name)
	for _, pod := range []string{"db-0", "db-1"} {
		url := pod + ".cluster-1." + name + "." + ns + ".svc.clusterset.local"
		harness.Eventually(t, time.Minute, url+" answers", func() error {
			a, err := d.ask(url)
			if err == nil && (a["pod"] != pod || a["cluster"] != "cluster-1") {
				t.Fatalf("%s answered from %v", url, a)
			}
			return err
		})
	}
}

// replica: a Service of cluster-1 replicated by syndicate answers at its
// replica's ClusterIP in cluster-3.
func (d *dpWorld) replica(t *testing.T) {
	const ns, name = "dp-syn", "api"
	appWith(t, d.clients[0], ns, name, 2, false, onDataplane, httpPort(80, 8080))
	replica := &corev1.Service{}
	harness.Eventually(t, time.Minute, "the replica in cluster-3 serving", func() error {
		if err := d.clients[2].Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, replica); err != nil {
			return err
		}
		ips, err := servedIPs(d.clients[2], ns, name)
		if err == nil && len(ips) == 0 {
			err = fmt.Errorf("the replica serves no address yet")
		}
		return err
	})
	d.untilAnswered(t, "http://"+replica.Spec.ClusterIP, "cluster-1")
}

func (d *dpWorld) unexported(t *testing.T) {
	const ns, name = "dp", "hidden"
	appWith(t, d.clients[0], ns, name, 1, false, onDataplane, httpPort(80, 8080))
	svc := &corev1.Service{}
	harness.Eventually(t, time.Minute, "the hidden Service's pods ready", func() error {
		if err := d.clients[0].Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		ips, err := readyPodIPs(d.clients[0], ns, name)
		if err == nil && len(ips) == 0 {
			err = fmt.Errorf("no ready pods")
		}
		return err
	})
	// Neither by name nor by cluster-1's own ClusterIP: a cluster's
	// Service range is its own.
	for _, url := range []string{name + "." + ns + ".svc.clusterset.local", "http://" + svc.Spec.ClusterIP} {
		if a, err := d.ask(url); err == nil {
			t.Errorf("%s answered from %v", url, a)
		}
	}
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/locality"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

// placement is where each cluster of TestLocalFirst runs, as on AWS: the
// client's cluster-2 in zone id use1-az1; cluster-1 in the same zone id
// under another zone name (another account names its zones otherwise);
// cluster-3 in another zone of us-east-1; cluster-4 in eu-west-1.
var placement = []struct{ zone, zoneID, region string }{
	{"us-east-1a", "use1-az1", "us-east-1"},
	{"us-east-1b", "use1-az1", "us-east-1"},
	{"us-east-1c", "use1-az2", "us-east-1"},
	{"eu-west-1a", "euw1-az1", "eu-west-1"},
}

// TestLocalFirst: four clusters on the lab's real data plane (the stock
// kube-proxy), placed as above, each exporting to its own Region and
// reading both. A Service of 2 socat pods in each, exported from all four
// with the PreferClose annotation; a client pod of cluster-2 asks it.
func TestLocalFirst(t *testing.T) {
	// Beside other tests: it asserts where requests go, not how fast.
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: len(placement), Dataplane: true}})
	const ns = "near"
	for i, cl := range w.clients {
		harness.PlaceNodes(t, cl, placement[i].zone, placement[i].zoneID)
		namespace(t, cl, ns)
	}
	d := &nearWorld{dpWorld: &dpWorld{world: w, at: w.env.Clusters[1], ns: ns, client: clientPod(t, w, 1, ns, onDataplane)}}
	stop := w.startControllers(t, d.place)
	t.Run("requests stay in the cluster and fail over by zone, then Region", d.failover)
	stop()
	t.Run("a silent cluster is drained, restored and forgotten", d.silent)
}

type nearWorld struct{ *dpWorld }

const nearName, nearPort = "near", 43

// place sets a controller's Region from its cluster's placement.
func (d *nearWorld) place(o *controller.Options) {
	o.Regions = []string{"us-east-1", "eu-west-1"}
	for i, c := range d.env.Clusters {
		if o.Config.Host == c.Config.Host {
			o.Region = placement[i].region
		}
	}
}

// stays asks n times; every request must be answered, from cluster. A
// request that fails is an error to retry on, not a failure: right after
// a change kube-proxy may still hold a state between two slice writes
// (an endpoint already hinted here, another not yet unready).
func (d *nearWorld) stays(cluster string, n int) func() error {
	host := nearName + "." + d.ns + ".svc.clusterset.local"
	return func() error {
		got, err := d.ask(n, "tcp", host, nearPort)
		if err == nil && !slices.Equal(got, []string{cluster}) {
			err = fmt.Errorf("%d requests answered by %v, want %s only", n, got, cluster)
		}
		return err
	}
}

// movesTo waits for the first answer from cluster (requests may fail on the
// way: an endpoint can be gone before kube-proxy knows), then for n of n.
func (d *nearWorld) movesTo(t *testing.T, cluster string, n int, after string) {
	t.Helper()
	host := nearName + "." + d.ns + ".svc.clusterset.local"
	since := time.Now()
	harness.Eventually(t, time.Minute, "requests answered by "+cluster+" after "+after, func() error {
		a, err := d.nc("tcp", nil, host, nearPort)
		if err != nil || a.cluster != cluster {
			return fmt.Errorf("answer %v %v", a, err)
		}
		return nil
	})
	t.Logf("first answer from %s %v after %s", cluster, time.Since(since).Round(100*time.Millisecond), after)
	harness.Eventually(t, time.Minute, fmt.Sprintf("%d of %d requests answered by %s", n, n, cluster), d.stays(cluster, n))
}

// scale sets the replicas of the Deployment in cluster i.
func (d *nearWorld) scale(t *testing.T, i int, replicas int32) {
	t.Helper()
	harness.Scale(t, d.clients[i], d.ns, nearName, replicas)
}

// failover: with cluster-2's endpoints ready, 20 of 20 requests stay in
// it; as the nearer clusters' Deployments scale to 0 requests go to
// cluster-1 (same zone id), then cluster-3 (same Region), then cluster-4,
// and back to cluster-2 when it returns. Then cluster-2's pods turn
// unready (their TCP listener killed, their containers running):
// cluster-1 answers until they are replaced.
func (d *nearWorld) failover(t *testing.T) {
	ctx := context.Background()
	for _, cl := range d.clients {
		listener(t, cl, d.ns, nearName, 2, nearPort, onDataplane)
		harness.Must(t, cl.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: nearName, Namespace: d.ns,
			Annotations: map[string]string{export.AnnotationTrafficDistribution: corev1.ServiceTrafficDistributionPreferClose}}}))
	}
	here := d.clients[1]
	harness.Eventually(t, time.Minute, "the import's slices hint cluster-2's endpoints for its zone, the others for none", func() error {
		var list discoveryv1.EndpointSliceList
		if err := here.List(ctx, &list, client.InNamespace(d.ns), client.MatchingLabels{mcsv1beta1.LabelServiceName: nearName}); err != nil {
			return err
		}
		hinted := map[string]string{}
		for _, s := range list.Items {
			for _, ep := range s.Endpoints {
				if ep.Hints != nil && len(ep.Hints.ForZones) > 0 {
					hinted[s.Labels[mcsv1beta1.LabelSourceCluster]] = ep.Hints.ForZones[0].Name
				}
			}
		}
		want := map[string]string{"cluster-1": locality.Nowhere, "cluster-2": "us-east-1b", "cluster-3": locality.Nowhere, "cluster-4": locality.Nowhere}
		for c, zone := range want {
			if hinted[c] != zone {
				return fmt.Errorf("hints by cluster %v, want %v", hinted, want)
			}
		}
		return nil
	})
	harness.Eventually(t, time.Minute, "20 of 20 requests answered in cluster-2", d.stays("cluster-2", 20))
	d.scale(t, 1, 0)
	d.movesTo(t, "cluster-1", 10, "cluster-2 scaled to 0 (same zone id)")
	d.scale(t, 0, 0)
	d.movesTo(t, "cluster-3", 10, "cluster-1 scaled to 0 (same Region)")
	d.scale(t, 2, 0)
	d.movesTo(t, "cluster-4", 10, "cluster-3 scaled to 0 (another Region)")
	for i := range d.clients {
		d.scale(t, i, 2)
	}
	d.movesTo(t, "cluster-2", 20, "every cluster scaled back to 2")

	pods := d.nearPods(t, 1)
	for _, p := range pods {
		// The container runs on (its UDP listener); its TCP port no longer
		// listens, which the lab's readiness check sees within a second.
		script := fmt.Sprintf("kill $(ss -Hltnp 'sport = :%d' | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u)", nearPort)
		if out, err := harness.Exec(ctx, d.env, d.at, d.ns, p, "sh", "-c", script); err != nil {
			t.Fatalf("killing the TCP listener of %s: %v %s", p, err, out)
		}
	}
	d.movesTo(t, "cluster-1", 10, "cluster-2's pods turned unready")
	for _, p := range pods {
		harness.Must(t, here.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: p}}))
	}
	d.movesTo(t, "cluster-2", 20, "cluster-2's pods were replaced")
}

// nearPods are the Ready pods of the Deployment in cluster i.
func (d *nearWorld) nearPods(t *testing.T, i int) []string {
	t.Helper()
	var names []string
	harness.Eventually(t, time.Minute, "2 Ready pods", func() error {
		var list corev1.PodList
		if err := d.clients[i].List(context.Background(), &list, client.InNamespace(d.ns), client.MatchingLabels{"app": nearName}); err != nil {
			return err
		}
		names = names[:0]
		for _, p := range list.Items {
			if podReady(&p) && p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		if len(names) != 2 {
			return fmt.Errorf("ready pods %v", names)
		}
		return nil
	})
	return names
}

// silent, at the shipped liveness settings (a heartbeat every 30 s, a
// TTL of 2 minutes): cluster-1's controller stops while its pods serve
// on. Every other cluster drains it within 3 minutes (the ServiceImport's
// ClustersDrained condition and a Warning Event name it) and cluster-2,
// its own Deployment scaled to 0, sends requests to cluster-3, not to the
// drained cluster-1 of its zone; cluster-1's controller back, it is
// restored and answers again; stopped again, then forgotten with
// clustermap forget-cluster, it leaves every running cluster's import.
func (d *nearWorld) silent(t *testing.T) {
	others := []*devenv.Cluster{d.env.Clusters[1], d.env.Clusters[2], d.env.Clusters[3]}
	t.Cleanup(d.startControllersIn(t, others, d.place))
	started := time.Now()
	stop1 := d.startControllersIn(t, d.env.Clusters[:1], d.place)
	here := d.clients[1]
	d.scale(t, 1, 0)
	d.movesTo(t, "cluster-1", 10, "cluster-2 scaled to 0, every cluster alive")
	// Each importer has read a heartbeat of cluster-1's (its second
	// record write): a record first seen proves alive then anyway.
	if wait := time.Until(started.Add(cloudmap.MinHeartbeat + 10*time.Second)); wait > 0 {
		time.Sleep(wait)
	}

	stop1()
	stopped := time.Now()
	for i, cl := range d.clients[1:] {
		// 3 minutes is the promise (docs/traffic.md); the bound leaves
		// the lab's load a minute.
		harness.Eventually(t, 4*time.Minute, fmt.Sprintf("cluster-1 drained in cluster-%d's import", i+2), d.drained(cl, "cluster-1"))
		t.Logf("cluster-1 drained in cluster-%d %v after its controller stopped", i+2, time.Since(stopped).Round(100*time.Millisecond))
	}
	harness.Eventually(t, time.Minute, "a ClusterDrained Event on the import", wantEvent(here, d.ns, nearName, "ClusterDrained", corev1.EventTypeWarning, "cluster-1"))
	d.movesTo(t, "cluster-3", 20, "cluster-1 was drained (its pods still serve)")

	stop1 = d.startControllersIn(t, d.env.Clusters[:1], d.place)
	harness.Eventually(t, time.Minute, "cluster-1 restored", d.drained(here))
	d.movesTo(t, "cluster-1", 10, "cluster-1's controller came back")

	stop1()
	// As an operator would for a cluster gone for good, without waiting
	// out its TTL (forget-cluster refusing a live cluster is
	// cloudmap.Forget's test).
	out := runCLI(t, "forget-cluster", "cluster-1", "--clusterset", devenv.DefaultClusterSet, "--region", "us-east-1", "--cloudmap-endpoint", d.cm.URL, "--force")
	if !strings.Contains(out, "cluster cluster-1 forgotten") {
		t.Fatalf("clustermap forget-cluster said:\n%s", out)
	}
	t.Logf("%s", out)
	for i, cl := range d.clients[1:] {
		harness.Eventually(t, time.Minute, fmt.Sprintf("cluster-1 gone from cluster-%d's import and its slices", i+2), func() error {
			si, err := getImport(cl, d.ns, nearName)
			if err != nil {
				return err
			}
			var clusters []string
			for _, c := range si.Status.Clusters {
				clusters = append(clusters, c.Cluster)
			}
			if slices.Contains(clusters, "cluster-1") || meta.FindStatusCondition(si.Status.Conditions, imports.ConditionClustersDrained) != nil {
				return fmt.Errorf("import lists %v, conditions %v", clusters, si.Status.Conditions)
			}
			var list discoveryv1.EndpointSliceList
			if err := cl.List(context.Background(), &list, client.InNamespace(d.ns), client.MatchingLabels{mcsv1beta1.LabelServiceName: nearName, mcsv1beta1.LabelSourceCluster: "cluster-1"}); err != nil {
				return err
			}
			if len(list.Items) > 0 {
				return fmt.Errorf("%d slices of cluster-1 left", len(list.Items))
			}
			return nil
		})
	}
	harness.Eventually(t, time.Minute, "20 of 20 requests answered by cluster-3", d.stays("cluster-3", 20))
}

// drained checks that the import's ClustersDrained condition names the
// clusters given (none: that it has no such condition).
func (d *nearWorld) drained(cl client.Client, clusters ...string) func() error {
	return func() error {
		si, err := getImport(cl, d.ns, nearName)
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(si.Status.Conditions, imports.ConditionClustersDrained)
		switch {
		case len(clusters) == 0 && c == nil:
			return nil
		case len(clusters) == 0:
			return fmt.Errorf("condition %s: %s", c.Status, c.Message)
		case c == nil || c.Status != metav1.ConditionTrue:
			return fmt.Errorf("no ClustersDrained condition: %v", si.Status.Conditions)
		}
		for _, cluster := range clusters {
			if !strings.Contains(c.Message, cluster+" (last proof of life") {
				return fmt.Errorf("condition says %q, want %s", c.Message, cluster)
			}
		}
		return nil
	}
}

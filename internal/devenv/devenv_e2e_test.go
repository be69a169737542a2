//go:build linux && e2e

package devenv_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// Three clusters, a Deployment and Service in each: pods run with IPs, the
// EndpointSlice controller publishes them, and no address is shared between
// clusters. Afterwards no process of the environment is left.
func TestThreeClustersServeEndpointSlices(t *testing.T) {
	var pids []int
	t.Run("clusters", func(t *testing.T) {
		env := harness.Clusters(t, 3)
		// The checks' own bound, from once the clusters are up: starting
		// three takes minutes on a loaded machine (a CI run beside the
		// e2e suite), and its time is not what is checked here.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		pids = env.Pids()
		if len(pids) < 3*5 {
			t.Fatalf("expected etcd, apiserver, controller-manager, scheduler and kwok per cluster, found %d processes", len(pids))
		}
		checkKubeconfig(t, env)

		podIPs := map[string]string{} // ip -> cluster
		svcIPs := map[string]string{}
		for _, c := range env.Clusters {
			cl := harness.ClientWith(t, c.Config, devenv.Scheme)
			checkIdentity(ctx, t, cl, c, env.ClusterSet)
			svc := deployWeb(ctx, t, cl)
			for _, ip := range svc.Spec.ClusterIPs {
				if !anyContains(c.ServiceCIDRs, ip) {
					t.Errorf("%s: service IP %s outside %v", c.ID, ip, c.ServiceCIDRs)
				}
				if other, dup := svcIPs[ip]; dup {
					t.Errorf("service IP %s in %s and %s", ip, other, c.ID)
				}
				svcIPs[ip] = c.ID
			}
			if len(svc.Spec.ClusterIPs) != 2 {
				t.Errorf("%s: a PreferDualStack Service got %v", c.ID, svc.Spec.ClusterIPs)
			}
			// One endpoint per pod and family: 3 IPv4 and 3 IPv6 addresses.
			for _, ip := range waitEndpoints(ctx, t, cl, 6) {
				if other, dup := podIPs[ip]; dup {
					t.Errorf("pod IP %s in %s and %s", ip, other, c.ID)
				}
				podIPs[ip] = c.ID
			}
			pods := &corev1.PodList{}
			if err := cl.List(ctx, pods, client.InNamespace("default")); err != nil {
				t.Fatal(err)
			}
			nodes := nodeCIDRs(ctx, t, cl)
			for _, p := range pods.Items {
				if err := checkPodIPs(c, &p, nodes[p.Spec.NodeName]); err != nil {
					t.Error(err)
				}
			}
		}
		if len(podIPs) != 18 {
			t.Errorf("want 18 distinct pod IPs over 3 clusters, got %d", len(podIPs))
		}
	})
	// The subtest's cleanup has stopped the clusters by now.
	for _, p := range pids {
		if devenv.Alive(p) {
			t.Errorf("process %d still runs after the environment stopped", p)
		}
	}
}

func anyContains(cidrs []string, ip string) bool {
	for _, c := range cidrs {
		if netip.MustParsePrefix(c).Contains(netip.MustParseAddr(ip)) {
			return true
		}
	}
	return false
}

func checkKubeconfig(t *testing.T, env *devenv.Env) {
	kc, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range env.Clusters {
		kctx := kc.Contexts[c.ID]
		if kctx == nil {
			t.Fatalf("kubeconfig has no context %s", c.ID)
		}
		if got := kc.Clusters[kctx.Cluster].Server; got != c.Server {
			t.Errorf("context %s points at %s, want %s", c.ID, got, c.Server)
		}
	}
}

// checkIdentity: each cluster knows itself and its clusterset, and sees only
// its own nodes (clusters sharing an etcd would see each other's).
func checkIdentity(ctx context.Context, t *testing.T, cl client.Client, c *devenv.Cluster, clusterset string) {
	for name, want := range map[string]string{aboutv1alpha1.ClusterIDProperty: c.ID, aboutv1alpha1.ClusterSetProperty: clusterset} {
		cp := &aboutv1alpha1.ClusterProperty{}
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, cp); err != nil {
			t.Fatalf("%s: ClusterProperty %s: %v", c.ID, name, err)
		}
		if cp.Spec.Value != want {
			t.Errorf("%s: ClusterProperty %s = %q, want %q", c.ID, name, cp.Spec.Value, want)
		}
	}
	nodes := &corev1.NodeList{}
	if err := cl.List(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if !strings.HasPrefix(n.Name, c.ID+"-") {
			t.Errorf("%s sees node %s of another cluster", c.ID, n.Name)
		}
	}
}

func deployWeb(ctx context.Context, t *testing.T, cl client.Client) *corev1.Service {
	svc := harness.CreateApp(t, cl, harness.App{Namespace: "default", Name: "web", Replicas: 3,
		Shape: func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack) }})
	if err := cl.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	return svc
}

// nodeCIDRs maps each node to its pod ranges.
func nodeCIDRs(ctx context.Context, t *testing.T, cl client.Client) map[string][]netip.Prefix {
	nodes := &corev1.NodeList{}
	if err := cl.List(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	out := map[string][]netip.Prefix{}
	for _, n := range nodes.Items {
		for _, c := range n.Spec.PodCIDRs {
			out[n.Name] = append(out[n.Name], netip.MustParsePrefix(c))
		}
	}
	return out
}

// checkPodIPs: a running pod has one address per family of its cluster, each
// in its node's range of that family, and none is the network address.
func checkPodIPs(c *devenv.Cluster, p *corev1.Pod, ranges []netip.Prefix) error {
	if len(p.Status.PodIPs) != len(c.PodCIDRs) || len(ranges) != len(c.PodCIDRs) || p.Status.PodIP != p.Status.PodIPs[0].IP {
		return fmt.Errorf("%s: pod %s has podIP %q podIPs %v (node ranges %v), want one per family of %v", c.ID, p.Name, p.Status.PodIP, p.Status.PodIPs, ranges, c.PodCIDRs)
	}
	for i, ip := range p.Status.PodIPs {
		a := netip.MustParseAddr(ip.IP)
		if !ranges[i].Contains(a) || a == ranges[i].Addr() {
			return fmt.Errorf("%s: pod %s address %s not a host address of its node's range %s", c.ID, p.Name, a, ranges[i])
		}
	}
	return nil
}

// waitEndpoints waits for the Service's EndpointSlices to list n ready pod IPs.
func waitEndpoints(ctx context.Context, t *testing.T, cl client.Client, n int) []string {
	for {
		slices := &discoveryv1.EndpointSliceList{}
		if err := cl.List(ctx, slices, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: "web"}); err != nil {
			t.Fatal(err)
		}
		var ips []string
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ips = append(ips, e.Addresses...)
				}
			}
		}
		if len(ips) == n {
			return ips
		}
		select {
		case <-ctx.Done():
			t.Fatalf("EndpointSlices list %v, want %d ready pod IPs", ips, n)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

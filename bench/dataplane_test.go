//go:build e2e

package bench

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/test/harness"
)

// BenchmarkDataplane: two clusters with a real data plane, controllers at
// the shipped defaults (1.5 s poll). 50 services of cluster-1 are exported
// one after another, 100 ms apart; a client pod of cluster-2 asks each by
// its clusterset name every 100 ms. Printed per service, p50/p99: from
// the ServiceExport's creation to cluster-2 holding the import's endpoints
// (object level), and to the client's first answered request (the import,
// then cluster-2's DNS and kube-proxy).
func BenchmarkDataplane(b *testing.B) {
	const services, ns = 50, "bench-dp"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := harness.ClustersWith(b, devenv.Options{Clusters: 2, Dataplane: true})
	cm := harness.CloudMap(b, cloudmaplocal.Options{})
	_, wait := startCounted(ctx, env, cm.URL)
	defer func() { cancel(); _ = wait() }()
	var clients []client.Client
	for _, c := range env.Clusters {
		cl := harness.Client(b, c.Config)
		if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
		clients = append(clients, cl)
	}
	on := map[string]string{dataplane.Annotation: "true"}
	var urls []string
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		createAppWith(ctx, b, clients[0], ns, name, 1, on, nil)
		urls = append(urls, "http://"+name+"."+ns+".svc.clusterset.local")
	}
	createAppWith(ctx, b, clients[1], ns, "client", 1, on, nil)
	waitReadyEndpoints(ctx, b, clients[0], services)
	client := waitPodReady(ctx, b, clients[1], ns, "client")
	imported := track(ctx, b, env.Clusters[1], imports.ManagedBy, mcsv1beta1.LabelServiceName)

	// The prober runs inside the client pod (kubectl exec) from before the
	// first export.
	args := append([]string{"--kubeconfig", env.Kubeconfig, "--context", env.Clusters[1].ID, "exec", "-n", ns, client, "--",
		filepath.Join(env.BinDir, "clustermap-dev"), "probe", "--timeout", "5m"}, urls...)
	probe := exec.CommandContext(ctx, filepath.Join(env.BinDir, "kubectl"), args...)
	out, err := probe.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := probe.Start(); err != nil {
		b.Fatal(err)
	}
	answered := make(chan [2]string, services)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 2 {
				answered <- [2]string{f[0], f[1]}
			}
		}
		close(answered)
	}()

	b.ResetTimer()
	created := map[string]time.Time{}
	importedAt := map[string]time.Time{}
	pollImports := func() {
		for i := range services {
			name := fmt.Sprintf("svc-%d", i)
			if _, done := importedAt[name]; !done && len(imported.ips(ns+"/"+name)) > 0 {
				importedAt[name] = time.Now()
			}
		}
	}
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		created[name] = time.Now()
		if err := clients[0].Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}); err != nil {
			b.Fatal(err)
		}
		for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			pollImports()
		}
	}
	var toImport, toRequest []time.Duration
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for len(toRequest) < services {
		select {
		case a, ok := <-answered:
			if !ok {
				b.Fatalf("the prober ended after %d answers: %v", len(toRequest), probe.Wait())
			}
			at, err := time.Parse(time.RFC3339Nano, a[1])
			if err != nil {
				b.Fatal(err)
			}
			name := strings.Split(strings.TrimPrefix(a[0], "http://"), ".")[0]
			toRequest = append(toRequest, at.Sub(created[name]))
		case <-tick.C:
			pollImports()
		}
	}
	for len(importedAt) < services {
		pollImports()
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	for name, at := range importedAt {
		toImport = append(toImport, at.Sub(created[name]))
	}
	_ = probe.Wait()
	fmt.Printf("dataplane: %d services exported 100 ms apart, controllers at shipped defaults (1.5 s poll)\n", services)
	m := shipped()
	bound := m.changeBound() + m.profile.OperationTime.Max
	why := fmt.Sprintf("a change's bound %v + the namespace's creation (an operation) <= %v", m.changeBound(), m.profile.OperationTime.Max)
	fmt.Printf("  export -> cluster-2 holds the import's endpoints:  p50 %v\n", percentile(toImport, 50).Round(time.Millisecond))
	within(b, "  ... p99", percentile(toImport, 99), bound, why)
	fmt.Printf("  export -> first answered request from cluster-2:   p50 %v\n", percentile(toRequest, 50).Round(time.Millisecond))
	within(b, "  ... p99", percentile(toRequest, 99), bound+time.Second, why+" + a request's 1 s")
}

// waitPodReady waits for an app's single pod to be Ready (its processes
// run and its ports listen) and returns its name.
func waitPodReady(ctx context.Context, b *testing.B, cl client.Client, ns, app string) string {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods := &corev1.PodList{}
		if err := cl.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{"app": app}); err != nil {
			b.Fatal(err)
		}
		if len(pods.Items) == 1 && slices.ContainsFunc(pods.Items[0].Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			return pods.Items[0].Name
		}
		if time.Now().After(deadline) {
			b.Fatalf("pod of %s not Ready after 2 minutes", app)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

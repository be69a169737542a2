//go:build e2e

package bench

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
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
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/test/harness"
)

// BenchmarkFailover: two clusters with a real data plane, their nodes in
// one zone id, controllers at the shipped defaults (1.5 s poll). A Service
// of 2 pods in each, exported from both with PreferClose. A client pod of
// cluster-2 asks its clusterset name all along (3 curl loops, 1 s timeout,
// 100 ms apart). 20 cycles: cluster-2's Deployment scales to 0, timed to
// the first answer from cluster-1 (failover); back to 2, timed to the
// first answer from cluster-2 (failback: its pods start in that time).
// Printed p50/p99, and how many requests of the cycles went unanswered.
func BenchmarkFailover(b *testing.B) {
	const cycles, ns, name = 20, "bench-failover", "near"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := harness.ClustersWith(b, devenv.Options{Clusters: 2, Dataplane: true})
	cm := harness.CloudMap(b, cloudmaplocal.Options{})
	_, wait := startCounted(ctx, env, cm.URL)
	defer func() { cancel(); _ = wait() }()
	on := map[string]string{dataplane.Annotation: "true"}
	var clients []client.Client
	for i, c := range env.Clusters {
		cl := harness.Client(b, c.Config)
		harness.PlaceNodes(b, cl, fmt.Sprintf("us-east-1%c", 'a'+i), "use1-az1")
		harness.Must(b, cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
		createAppWith(ctx, b, cl, ns, name, 2, on, nil)
		harness.Must(b, cl.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{export.AnnotationTrafficDistribution: corev1.ServiceTrafficDistributionPreferClose}}}))
		clients = append(clients, cl)
	}
	here := clients[1]
	createAppWith(ctx, b, here, ns, "client", 1, on, nil)
	pod := waitPodReady(ctx, b, here, ns, "client")

	url := "http://" + name + "." + ns + ".svc.clusterset.local"
	loop := fmt.Sprintf(`while :; do a=$(curl -s -m 1 %s); echo "$(date +%%s%%N) $a"; sleep 0.1; done`, url)
	probe := exec.CommandContext(ctx, filepath.Join(env.BinDir, "kubectl"), "--kubeconfig", env.Kubeconfig, "--context", env.Clusters[1].ID,
		"exec", "-n", ns, pod, "--", "sh", "-c", fmt.Sprintf("for i in 1 2 3; do (%s) & done; wait", loop))
	out, err := probe.StdoutPipe()
	harness.Must(b, err)
	harness.Must(b, probe.Start())
	type answer struct {
		at      time.Time
		cluster string
	}
	answers := make(chan answer, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			at, rest, _ := strings.Cut(sc.Text(), " ")
			if ns, err := strconv.ParseInt(at, 10, 64); err == nil {
				answers <- answer{time.Unix(0, ns), dataplane.ParseAnswer(rest)["cluster"]}
			}
		}
		close(answers)
	}()
	// first waits for an answer from cluster stamped after since; then,
	// when settle is set, for settle answers in a row from it. While
	// measuring, it counts the requests and those nobody answered.
	measuring, asked, unanswered, phase := false, 0, map[string]int{}, ""
	first := func(cluster string, since time.Time, settle int) time.Time {
		var at time.Time
		run := 0
		deadline := time.After(3 * time.Minute)
		for {
			select {
			case a, ok := <-answers:
				if !ok {
					b.Fatalf("the client's probes ended: %v", probe.Wait())
				}
				if measuring {
					asked++
					if a.cluster == "" {
						unanswered[phase]++
					}
				}
				if a.at.Before(since) {
					continue
				}
				if a.cluster != cluster {
					run = 0
					continue
				}
				if at.IsZero() {
					at = a.at
				}
				if run++; run >= settle {
					return at
				}
			case <-deadline:
				b.Fatalf("no answer from %s for 3 minutes", cluster)
			}
		}
	}
	scale := func(replicas int32) time.Time {
		harness.Scale(b, here, ns, name, replicas)
		return time.Now()
	}
	first("cluster-2", time.Now(), 30)
	b.ResetTimer()
	measuring = true
	var failover, failback []time.Duration
	for range cycles {
		phase = "failover"
		gone := scale(0)
		failover = append(failover, first("cluster-1", gone, 1).Sub(gone))
		phase = "failback"
		back := scale(2)
		failback = append(failback, first("cluster-2", back, 30).Sub(back))
	}
	b.StopTimer()
	fmt.Printf("failover: %d cycles, 2 clusters in one zone id, controllers at shipped defaults (1.5 s poll), %d cores\n", cycles, runtimeCores())
	fmt.Printf("  local Deployment to 0 -> first answer from the other cluster:  p50 %v\n", percentile(failover, 50).Round(10*time.Millisecond))
	m := shipped()
	asking := 1100 * time.Millisecond // a curl's timeout and its gap
	within(b, "  ... p99", percentile(failover, 99), m.changeBound()+asking, fmt.Sprintf("a change's bound %v + a request's timeout and gap %v", m.changeBound(), asking))
	fmt.Printf("  local Deployment back -> first local answer (pods start; no target: the pods' start is the machine's): p50 %v  p99 %v\n",
		percentile(failback, 50).Round(10*time.Millisecond), percentile(failback, 99).Round(10*time.Millisecond))
	fmt.Printf("  requests over all cycles: %d; unanswered (curl timed out or refused): %d while failing over, %d while failing back\n",
		asked, unanswered["failover"], unanswered["failback"])
}

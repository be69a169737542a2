//go:build e2e

package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// counter reads one of this process's Prometheus counters, summed over labels.
func counter(b *testing.B, name string) float64 {
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
		}
	}
	return v
}

// BenchmarkCloudMapDNS: 200 annotated headless Services (the seed's fleet)
// of 2 pods in one private DNS namespace. Prints the time from a new pod's
// ready address in its EndpointSlice to its instance in Cloud Map, and the
// Cloud Map calls of a drift check that finds nothing to repair. Targets:
// p99 under 1 s; at most one call per Service per drift check.
func BenchmarkCloudMapDNS(b *testing.B) {
	const services, replicas = 200, 2
	const drift = 10 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := harness.Clusters(b, 1)
	cm := harness.CloudMap(b, cloudmaplocal.Options{})
	c := cloudmaptest.ClientOf(b, cm.URL, cloudmapclient.Options{})
	cloudmaptest.DNSNamespace(b, c, "test-namespace", "vpc-1")
	wait := env.StartControllers(ctx, cm.URL, func(*devenv.Cluster) logr.Logger { return logr.Discard() }, func(o *controller.Options) {
		o.MCS, o.CloudMapDNS, o.DriftPeriod = false, true, drift
	})
	defer func() { cancel(); _ = wait() }()
	cl := harness.Client(b, env.Clusters[0].Config)
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		b.Fatal(err)
	}
	for s := 0; s < services; s++ {
		name := fmt.Sprintf("svc-%d", s)
		createApp(ctx, b, cl, "bench", name, replicas, func(s *corev1.Service) {
			s.Annotations = map[string]string{cloudmapdns.AnnotationNamespace: "test-namespace", cloudmapdns.AnnotationHostname: name}
			s.Spec.ClusterIP = corev1.ClusterIPNone
		})
	}
	// Every Cloud Map service created and holding its pods before timing.
	var ids map[string]string
	setup := time.Now()
	for {
		ids = map[string]string{}
		p := sd.NewListServicesPaginator(c, &sd.ListServicesInput{})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range page.Services {
				ids[aws.ToString(s.Name)] = aws.ToString(s.Id)
			}
		}
		total := 0
		for _, id := range ids {
			out, err := c.ListInstances(ctx, &sd.ListInstancesInput{ServiceId: aws.String(id)})
			if err != nil {
				b.Fatal(err)
			}
			total += len(out.Instances)
		}
		if total == services*replicas {
			break
		}
		if time.Since(setup) > 5*time.Minute {
			b.Fatalf("%d of %d instances registered", total, services*replicas)
		}
		time.Sleep(2 * time.Second)
	}
	b.Logf("%d instances registered %v after the Services were created", services*replicas, time.Since(setup).Round(time.Second))
	source := track(ctx, b, env.Clusters[0], "endpointslice-controller.k8s.io", discoveryv1.LabelServiceName)
	b.ResetTimer()

	// One more pod for 50 Services in turn; timed from its ready address in
	// the EndpointSlice to its instance in ListInstances.
	var lat []time.Duration
	for i := 0; i < 50; i++ {
		name := fmt.Sprintf("svc-%d", i*services/50)
		ip, seen := addPod(ctx, b, cl, source, "bench", name)
		for registered := false; !registered; time.Sleep(5 * time.Millisecond) {
			out, err := c.ListInstances(ctx, &sd.ListInstancesInput{ServiceId: aws.String(ids[name])})
			if err != nil {
				b.Fatal(err)
			}
			for _, in := range out.Instances {
				registered = registered || in.Attributes[cloudmapdns.AttrIPv4] == ip
			}
			if time.Since(seen) > time.Minute {
				b.Fatalf("%s of %s not in Cloud Map a minute after it was ready", ip, name)
			}
		}
		lat = append(lat, time.Since(seen))
	}

	// Drift checks with nothing to repair: the emulator's call counts taken
	// halfway between cycles, when none is running, so exactly `cycles`
	// whole cycles fall between them.
	const cycles = 4
	nextCycle := func() {
		n := counter(b, "clustermap_cloudmapdns_drift_cycles_total")
		for counter(b, "clustermap_cloudmapdns_drift_cycles_total") == n {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(drift / 2)
	}
	nextCycle()
	repairsBefore := counter(b, "clustermap_cloudmapdns_instances_total")
	before := emulatorCalls(b, cm.AdminURL)
	for range cycles {
		nextCycle()
	}
	after := emulatorCalls(b, cm.AdminURL)
	calls, byOp := callsBetween(before, after)
	if changed := counter(b, "clustermap_cloudmapdns_instances_total") - repairsBefore; changed != 0 {
		b.Fatalf("%.0f instances changed during drift checks that should find nothing", changed)
	}
	b.StopTimer()

	fmt.Printf("Annotated Services -> Cloud Map DNS namespace (emulator), %d Services x %d pods, %d cores:\n", services, replicas, runtimeCores())
	fmt.Printf("  new pod ready in its EndpointSlice -> instance in Cloud Map (50 changes): p50 %v  p99 %v  max %v\n",
		percentile(lat, 50).Round(time.Millisecond), percentile(lat, 99).Round(time.Millisecond), percentile(lat, 100).Round(time.Millisecond))
	fmt.Printf("  drift check finding nothing, %d cycles: %s\n", cycles, byOp)
	atMost(b, fmt.Sprintf("  ... Cloud Map calls per cycle for %d Services", services), calls/cycles, services, "one read per Service")
	b.ReportMetric(float64(percentile(lat, 99).Milliseconds()), "ready-to-instance-p99-ms")
	b.ReportMetric(calls/cycles, "calls/drift-cycle")
}

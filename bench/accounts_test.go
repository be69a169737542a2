//go:build e2e

package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

// A clusterset across two accounts, as the benchmarks run it: cluster-1
// exports from a member account, cluster-2 imports in the owner account,
// which made the namespaces and shared them beforehand (as a platform
// team's infrastructure code would).
const (
	ownerAccount  = "111111111111"
	memberAccount = "222222222222"
)

// pairSetup is the emulator options and controller tuning of one pair.
type pairSetup struct {
	name   string
	shared bool
}

var pairs = []pairSetup{{"one account", false}, {"two accounts", true}}

func (p pairSetup) emulator(opts cloudmaplocal.Options) cloudmaplocal.Options {
	if p.shared {
		opts.Account, opts.Accounts = ownerAccount, map[string]string{"AKIDMEMBER": memberAccount}
	}
	return opts
}

// tune runs cluster-1 in the member account when the pair is shared.
func (p pairSetup) tune(exporter string) func(string, *controller.Options) {
	return func(cluster string, o *controller.Options) {
		if !p.shared {
			return
		}
		o.OwnerAccount = ownerAccount
		if cluster == exporter {
			o.CloudMapCredentials = credentials.NewStaticCredentialsProvider("AKIDMEMBER", "secret", "")
		}
	}
}

// share makes the owner's namespaces (and the clusterset's change-record
// namespace) and shares them with the member account.
func (p pairSetup) share(ctx context.Context, b *testing.B, cm *devenv.CloudMap, namespaces ...string) {
	if !p.shared {
		return
	}
	c := cloudmaptest.ClientOf(b, cm.URL, cloudmapclient.Options{})
	for _, name := range append(namespaces, cloudmap.ChangesNamespace(devenv.DefaultClusterSet)) {
		arn := "arn:aws:servicediscovery:us-east-1:" + ownerAccount + ":namespace/" + cloudmaptest.Namespace(b, c, name)
		if err := cm.Share(arn, memberAccount); err != nil {
			b.Fatal(err)
		}
	}
}

// controlPlane sums the calls that count against the control-plane
// budget (all but Discover*).
func controlPlane(calls map[string]float64) (control, data float64) {
	for op, n := range calls {
		if op == "DiscoverInstances" || op == "DiscoverInstancesRevision" {
			data += n
		} else {
			control += n
		}
	}
	return control, data
}

func diffMap(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for op, v := range after {
		if d := v - before[op]; d > 0 {
			out[op] = d
		}
	}
	return out
}

// BenchmarkAccounts: a same-account pair beside a pair across two accounts
// (cluster-1 exporting from the member account, cluster-2 importing in the
// owner account), at the shipped defaults (20 control-plane calls/s, 200
// Discover*/s, 1.5 s poll). Each pair: a bulk export of 200 services x 5
// endpoints at once, timed to the last import, with the exporter's calls by
// operation; then 50 single pod changes, timed from the exporter's
// EndpointSlice to the importer's. Targets come from the model
// (targets_test.go): the bulk's is the write floor of every control-plane
// call the exporter made at 20/s plus a change's bound; a pod change's p99
// is a change's bound (10 s under the aws profile), across accounts the
// shared one (18 s: the change record's write and read come first).
func BenchmarkAccounts(b *testing.B) {
	type result struct {
		name           string
		bulk           time.Duration
		exporterCalls  map[string]float64
		podP50, podP99 time.Duration
		podCalls       [2]map[string]float64
		model          model
		shared         bool
	}
	var results []result
	for _, p := range pairs {
		b.Run(p.name, func(b *testing.B) {
			const namespaces, perNS, replicas = 2, 100, 5
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			env := harness.ClustersWith(b, devenv.Options{Clusters: 2, Nodes: 2})
			cm := harness.CloudMap(b, p.emulator(cloudmaplocal.Options{}))
			var nsNames []string
			for n := range namespaces {
				nsNames = append(nsNames, fmt.Sprintf("bulk-%d", n))
			}
			p.share(ctx, b, cm, nsNames...)
			counts, _, wait := startCountedLogged(ctx, env, cm.URL, p.tune(env.Clusters[0].ID))
			defer func() { cancel(); _ = wait() }()
			src := harness.Client(b, env.Clusters[0].Config)
			dst := harness.Client(b, env.Clusters[1].Config)
			type svcKey struct{ ns, name string }
			var keys []svcKey
			for _, ns := range nsNames {
				for _, cl := range []client.Client{src, dst} {
					if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
						b.Fatal(err)
					}
				}
				for i := range perNS {
					keys = append(keys, svcKey{ns, fmt.Sprintf("svc-%d", i)})
					createApp(ctx, b, src, ns, keys[len(keys)-1].name, replicas, nil)
				}
			}
			waitReadyEndpoints(ctx, b, src, len(keys)*replicas)
			source := track(ctx, b, env.Clusters[0], "endpointslice-controller.k8s.io", discoveryv1.LabelServiceName)
			imported := track(ctx, b, env.Clusters[1], imports.ManagedBy, mcsv1beta1.LabelServiceName)
			exporter, importer := env.Clusters[0].ID, env.Clusters[1].ID

			b.ResetTimer()
			before := counts.snapshot(exporter)
			start := time.Now()
			for _, k := range keys {
				if err := src.Create(ctx, &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.ns}}); err != nil {
					b.Fatal(err)
				}
			}
			r := result{name: p.name, model: shipped(), shared: p.shared}
			for done := 0; done < len(keys); {
				if time.Since(start) > 15*time.Minute {
					b.Fatalf("%d of %d services imported", done, len(keys))
				}
				time.Sleep(100 * time.Millisecond)
				done = 0
				for _, k := range keys {
					if len(imported.ips(k.ns+"/"+k.name)) == replicas {
						done++
					}
				}
			}
			r.bulk = time.Since(start)
			r.exporterCalls = diffMap(before, counts.snapshot(exporter))

			// Pod changes, one at a time at random gaps, after the bulk settled.
			time.Sleep(10 * time.Second)
			podBefore := [2]map[string]float64{counts.snapshot(exporter), counts.snapshot(importer)}
			var lat []time.Duration
			for i := range 50 {
				k := keys[i*(len(keys)/50)]
				svc := k.ns + "/" + k.name
				ip, seen := addPod(ctx, b, src, source, k.ns, k.name)
				for !imported.ips(svc)[ip] {
					if time.Since(seen) > time.Minute {
						b.Fatalf("%s of %s not imported a minute after it appeared", ip, svc)
					}
					time.Sleep(2 * time.Millisecond)
				}
				lat = append(lat, time.Since(seen))
				time.Sleep(time.Duration(i%4) * 500 * time.Millisecond)
			}
			r.podP50, r.podP99 = percentile(lat, 50), percentile(lat, 99)
			r.podCalls = [2]map[string]float64{diffMap(podBefore[0], counts.snapshot(exporter)), diffMap(podBefore[1], counts.snapshot(importer))}
			b.StopTimer()
			results = append(results, r)
			b.ReportMetric(r.bulk.Seconds(), "bulk-s")
			b.ReportMetric(float64(r.podP99.Milliseconds()), "podchange-p99-ms")
		})
	}
	fmt.Printf("MCS in one account and across two, at the shipped defaults, cluster-1 exporting (the member account across two), cluster-2 importing, %d cores:\n", runtimeCores())
	for _, r := range results {
		control, data := controlPlane(r.exporterCalls)
		_, byOp := callsBetween(nil, r.exporterCalls)
		bound, why := r.model.changeBound(), r.model.changeWhy()
		if r.shared {
			bound, why = r.model.sharedChangeBound(), r.model.sharedChangeWhy()
		}
		fmt.Printf("  %s: 200 services x 5 endpoints exported at once; exporter calls: %.0f control-plane, %.0f data-plane [%s]\n", r.name, control, data, byOp)
		within(b, "  ... all imported", r.bulk, writeFloor(control)+bound,
			fmt.Sprintf("write floor %v of its calls at %d/s + a change's bound %v", writeFloor(control).Round(100*time.Millisecond), cloudmapclient.DefaultQPS, bound))
		fmt.Printf("  %s: new pod in the exporter's EndpointSlice -> in the importer's (50 changes): p50 %v\n", r.name, r.podP50.Round(time.Millisecond))
		within(b, "  ... p99", r.podP99, bound, why)
		for i, who := range []string{"exporter", "importer"} {
			t, byOp := callsBetween(nil, r.podCalls[i])
			fmt.Printf("    50 pod changes, %s calls: %.0f [%s]\n", who, t, byOp)
		}
	}
}

//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/test/harness"
)

const chartDir, release, releaseNS = "../../charts/clustermap", "clustermap", "clustermap-system"

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// render does what helm template does: values (schema-checked), then the
// templates, split into objects; NOTES.txt is not one. Hooks are left out,
// as from a release's manifest: Helm makes them apart, when they run
// (TestChartHooks).
func render(ch *chart.Chart, values map[string]any) ([]*unstructured.Unstructured, error) {
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: release, Namespace: releaseNS, IsInstall: true, Revision: 1}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		for _, doc := range releaseutil.SplitManifests(files[name]) {
			m := map[string]any{}
			if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			o := &unstructured.Unstructured{Object: m}
			if len(m) > 0 && o.GetAnnotations()["helm.sh/hook"] == "" {
				objs = append(objs, o)
			}
		}
	}
	return objs, nil
}

// crds are the chart's crds/ directory, which Helm installs first.
func crds(t *testing.T, ch *chart.Chart) []*unstructured.Unstructured {
	var objs []*unstructured.Unstructured
	for _, c := range ch.CRDObjects() {
		m := map[string]any{}
		if err := yaml.Unmarshal(c.File.Data, &m); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	if len(objs) != 3 {
		t.Fatalf("the chart should ship 3 CRDs, has %d", len(objs))
	}
	return objs
}

func applyAll(ctx context.Context, cl client.Client, objs []*unstructured.Unstructured, opts ...client.PatchOption) error {
	for _, u := range objs {
		u = u.DeepCopy() // the answer lands in it
		if err := cl.Patch(ctx, u, client.Apply, append(opts, client.FieldOwner("helm-test"), client.ForceOwnership)...); err != nil {
			return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}

func modeValues(mcs, cmdns, synd, dns bool) map[string]any {
	return map[string]any{"region": "us-east-1", "mcs": map[string]any{"enabled": mcs}, "cloudmapDNS": map[string]any{"enabled": cmdns},
		"syndicate": map[string]any{"enabled": synd}, "dns": map[string]any{"enabled": dns},
		"serviceMonitor": map[string]any{"enabled": true}, "serviceAccount": map[string]any{"roleArn": "arn:aws:iam::123456789012:role/clustermap"},
		"networkPolicy": map[string]any{"enabled": true}}
}

func TestChart(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	ch := loadChart(t)
	monitoring := monitoringCRDs(t)
	for _, cl := range w.clients {
		namespace(t, cl, releaseNS)
		harness.Must(t, applyAll(context.Background(), cl, crds(t, ch)))
		harness.Must(t, applyAll(context.Background(), cl, monitoring))
		harness.Eventually(t, 30*time.Second, "the monitoring CRDs are served", func() error {
			for _, kind := range []string{"ServiceMonitorList", "PrometheusRuleList"} {
				l := &unstructured.UnstructuredList{}
				l.SetAPIVersion("monitoring.coreos.com/v1")
				l.SetKind(kind)
				if err := cl.List(context.Background(), l); err != nil {
					return err
				}
			}
			return nil
		})
	}
	t.Run("every mode combination renders and applies (server dry run)", func(t *testing.T) { everyMode(t, w, ch) })
	t.Run("bad values fail with a clear message", func(t *testing.T) { badValues(t, ch) })
	t.Run("every TTL the controller takes renders", func(t *testing.T) { goodTTLs(t, ch) })
	t.Run("accounts and Regions reach the controller", func(t *testing.T) { accountsValues(t, ch) })
	t.Run("a hub registry needs no Region and mounts the hub kubeconfig", func(t *testing.T) { hubValues(t, w, ch) })
	t.Run("drains, GitOps, RBAC and DNS values install", func(t *testing.T) { w.operatorValues(t, ch) })
	t.Run("MCS works with the chart's ServiceAccount only", func(t *testing.T) { w.asServiceAccount(t, ch) })
}

func everyMode(t *testing.T, w *world, ch *chart.Chart) {
	for i := 1; i < 16; i++ {
		mcs, cmdns, synd, dns := i&1 != 0, i&2 != 0, i&4 != 0, i&8 != 0
		objs, err := render(ch, modeValues(mcs, cmdns, synd, dns))
		if err != nil {
			t.Errorf("mcs=%v cloudmapDNS=%v syndicate=%v dns=%v: %v", mcs, cmdns, synd, dns, err)
			continue
		}
		kinds := map[string]int{}
		var roles []string
		var applicable []*unstructured.Unstructured
		for _, u := range objs {
			kinds[u.GetKind()]++
			if u.GetKind() == "ClusterRole" {
				roles = append(roles, u.GetName())
			}
			applicable = append(applicable, u)
		}
		if err := applyAll(context.Background(), w.clients[0], applicable, client.DryRunAll); err != nil {
			t.Errorf("mcs=%v cloudmapDNS=%v syndicate=%v dns=%v: %v", mcs, cmdns, synd, dns, err)
		}
		var want []string
		for mode, on := range map[string]bool{"mcs": mcs, "cloudmap-dns": cmdns, "syndicate": synd} {
			if on {
				want = append(want, "clustermap-"+mode)
			}
		}
		if dns {
			want = append(want, "clustermap-dns")
		}
		want = append(want, "clustermap-edit", "clustermap-view") // aggregated into edit, admin, view
		want = append(want, "clustermap-metrics-reader")          // /metrics behind authorization (metricsSecure)
		sort.Strings(want)
		sort.Strings(roles)
		if !slices.Equal(roles, want) {
			t.Errorf("mcs=%v cloudmapDNS=%v syndicate=%v dns=%v: ClusterRoles %v, want %v", mcs, cmdns, synd, dns, roles, want)
		}
		deployments := 0
		if mcs || cmdns || synd {
			deployments++
		}
		if dns {
			deployments++
		}
		if kinds["Deployment"] != deployments || kinds["PodDisruptionBudget"] != deployments {
			t.Errorf("mcs=%v cloudmapDNS=%v syndicate=%v dns=%v: %v", mcs, cmdns, synd, dns, kinds)
		}
	}
}

func badValues(t *testing.T, ch *chart.Chart) {
	for _, c := range []struct {
		what  string
		set   func(map[string]any)
		error string
	}{
		{"no region", func(v map[string]any) { delete(v, "region") }, "region is required"},
		{"a region that is no region", func(v map[string]any) { v["region"] = "Oregon" }, "region"},
		{"a misspelt mode", func(v map[string]any) { v["cloudmapDns"] = map[string]any{"enabled": true} }, "cloudmapDns"},
		{"a mode that is not a switch", func(v map[string]any) { v["mcs"] = map[string]any{"enabled": "yes"} }, "mcs"},
		{"nothing enabled", func(v map[string]any) { v["mcs"] = map[string]any{"enabled": false} }, "nothing to install"},
		{"a bad duration", func(v map[string]any) {
			v["syndicate"] = map[string]any{"enabled": true, "peerGracePeriod": "ten minutes"}
		}, "peerGracePeriod"},
		{"a bad role ARN", func(v map[string]any) { v["serviceAccount"] = map[string]any{"roleArn": "clustermap"} }, "roleArn"},
		{"an owner account that is no account", func(v map[string]any) { v["cloudMap"] = map[string]any{"ownerAccount": "1234"} }, "ownerAccount"},
		{"a Region list with no Region", func(v map[string]any) { v["cloudMap"] = map[string]any{"regions": []any{"Ireland"}} }, "regions"},
		{"a bad TTL", func(v map[string]any) { v["cloudMap"] = map[string]any{"silentClusterTTL": "a day"} }, "silentClusterTTL"},
		{"a TTL under three heartbeats, which the controller refuses", func(v map[string]any) { v["cloudMap"] = map[string]any{"silentClusterTTL": "1m"} }, "silentClusterTTL"},
		{"a TTL of 80 s, under three heartbeats", func(v map[string]any) { v["cloudMap"] = map[string]any{"silentClusterTTL": "80s"} }, "silentClusterTTL"},
		{"the budget of old (minAvailable blocked every eviction at one replica)", func(v map[string]any) {
			v["podDisruptionBudget"] = map[string]any{"minAvailable": 1}
		}, "minAvailable"},
		{"an extra argument that is no flag", func(v map[string]any) { v["extraArgs"] = []any{"debug"} }, "extraArgs"},
		{"a cluster id that is no DNS label", func(v map[string]any) { v["clusterProperties"] = map[string]any{"clusterId": "Cluster_1"} }, "clusterId"},
		{"a registry that is neither", func(v map[string]any) { v["mcs"] = map[string]any{"enabled": true, "registry": "consul"} }, "registry"},
		{"a hub registry beside Cloud Map DNS, without a Region", func(v map[string]any) {
			delete(v, "region")
			v["mcs"] = map[string]any{"enabled": true, "registry": "hub"}
			v["cloudmapDNS"] = map[string]any{"enabled": true}
		}, "region is required"},
		{"a move from the registry moved to", func(v map[string]any) {
			v["mcs"] = map[string]any{"enabled": true, "registry": "hub", "migratingFrom": "hub"}
		}, "migratingFrom"},
		{"a move in no known phase", func(v map[string]any) {
			v["mcs"] = map[string]any{"enabled": true, "registry": "hub", "migratingFrom": "cloudmap", "migrationPhase": "halfway"}
		}, "migrationPhase"},
		{"a DNS ClusterIP that is no address", func(v map[string]any) {
			v["dns"] = map[string]any{"enabled": true, "clusterIP": "auto"}
		}, "clusterIP"},
	} {
		v := modeValues(true, false, false, false)
		delete(v, "serviceMonitor")
		delete(v, "serviceAccount")
		c.set(v)
		_, err := render(ch, v)
		if err == nil || !strings.Contains(err.Error(), c.error) {
			t.Errorf("%s: want an error naming %q, got %v", c.what, c.error, err)
		} else {
			t.Logf("%s: %v", c.what, strings.ReplaceAll(err.Error(), "\n", " "))
		}
	}
}

// goodTTLs render: every TTL the controller takes.
func goodTTLs(t *testing.T, ch *chart.Chart) {
	for _, ttl := range []string{"", "0s", "90s", "1m30s", "2m", "30m", "45m30s", "1h", "2h30m", "1800s"} {
		v := modeValues(true, false, false, false)
		v["cloudMap"] = map[string]any{"silentClusterTTL": ttl}
		if _, err := render(ch, v); err != nil {
			t.Errorf("silentClusterTTL %q: %v", ttl, err)
		}
	}
}

// hubValues: with mcs.registry=hub the controller gets the hub kubeconfig
// from its Secret and no Cloud Map flag, and no Region is needed.
func hubValues(t *testing.T, w *world, ch *chart.Chart) {
	v := modeValues(true, false, false, false)
	delete(v, "region")
	v["mcs"] = map[string]any{"enabled": true, "registry": "hub", "hubKubeconfigSecret": "hub-member"}
	v["cloudMap"] = map[string]any{"silentClusterTTL": "5m"}
	objs, err := render(ch, v)
	harness.Must(t, err)
	harness.Must(t, applyAll(context.Background(), w.clients[0], objs, client.DryRunAll))
	var args []string
	var secret string
	for _, u := range objs {
		if u.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		for _, a := range containers[0].(map[string]any)["args"].([]any) {
			args = append(args, a.(string))
		}
		volumes, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
		for _, vol := range volumes {
			if vol.(map[string]any)["name"] == "hub" {
				secret, _, _ = unstructured.NestedString(vol.(map[string]any), "secret", "secretName")
			}
		}
	}
	for _, want := range []string{"--registry=hub", "--hub-kubeconfig=/etc/clustermap-hub/kubeconfig", "--silent-cluster-ttl=5m"} {
		if !slices.Contains(args, want) {
			t.Errorf("the controller's arguments lack %s: %v", want, args)
		}
	}
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--region") || strings.HasPrefix(a, "--cloudmap") }) {
		t.Errorf("Cloud Map arguments with a hub registry: %v", args)
	}
	if secret != "hub-member" {
		t.Errorf("the hub volume's Secret is %q, want hub-member", secret)
	}

	// Moving from Cloud Map to the hub: both read, the Region needed.
	v["mcs"] = map[string]any{"enabled": true, "registry": "hub", "hubKubeconfigSecret": "hub-member", "migratingFrom": "cloudmap", "migrationPhase": "leaving"}
	if _, err := render(ch, v); err == nil || !strings.Contains(err.Error(), "region is required") {
		t.Errorf("a move from Cloud Map without a Region: %v, want region is required", err)
	}
	v["region"] = "us-east-1"
	objs, err = render(ch, v)
	harness.Must(t, err)
	harness.Must(t, applyAll(context.Background(), w.clients[0], objs, client.DryRunAll))
	args = nil
	for _, u := range objs {
		if u.GetKind() == "Deployment" {
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			for _, a := range containers[0].(map[string]any)["args"].([]any) {
				args = append(args, a.(string))
			}
		}
	}
	for _, want := range []string{"--registry=hub", "--registry-migrating-from=cloudmap", "--registry-migration-phase=leaving", "--hub-kubeconfig=/etc/clustermap-hub/kubeconfig", "--region=us-east-1"} {
		if !slices.Contains(args, want) {
			t.Errorf("moving to the hub, the controller's arguments lack %s: %v", want, args)
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(args), func(a string) bool { return !strings.HasPrefix(a, "--silent-cluster-ttl") })); n != 1 {
		t.Errorf("--silent-cluster-ttl %d times: %v", n, args)
	}
}

func accountsValues(t *testing.T, ch *chart.Chart) {
	v := modeValues(true, false, false, false)
	v["cloudMap"] = map[string]any{"ownerAccount": "111111111111", "regions": []any{"us-east-1", "eu-west-1"}, "staleClusterExpiry": "2h"} // the deprecated name is still read
	objs, err := render(ch, v)
	harness.Must(t, err)
	var args []string
	for _, u := range objs {
		if u.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			for _, a := range c.(map[string]any)["args"].([]any) {
				args = append(args, a.(string))
			}
		}
	}
	for _, want := range []string{"--cloudmap-owner-account=111111111111", "--regions=us-east-1,eu-west-1", "--silent-cluster-ttl=2h"} {
		if !slices.Contains(args, want) {
			t.Errorf("the controller's arguments lack %s: %v", want, args)
		}
	}
}

// asServiceAccount installs the MCS-only chart in both clusters and runs
// the controllers authenticated as its ServiceAccount only (a token from
// the TokenRequest API, no client certificate), through the export/import
// scenarios.
func (w *world) asServiceAccount(t *testing.T, ch *chart.Chart) {
	ctx := context.Background()
	asSA, configs := w.chartServiceAccount(t, ch, map[string]any{"region": "us-east-1",
		"metricsReaders": []any{map[string]any{"name": metricsReader, "namespace": releaseNS}}})
	leastPrivilege(t, configs[w.env.Clusters[0].Config.Host])
	writesOnlyItsOwn(t, w.env.Clusters[0].Config, configs[w.env.Clusters[0].Config.Host])
	calls := &cloudmapclient.Calls{}
	var mu sync.Mutex
	metricsAddrs := map[string]string{}
	t.Cleanup(w.startControllers(t, func(o *controller.Options) {
		host := o.Config.Host
		asSA(o)
		o.OnCloudMapCall = calls.Record
		// /metrics as the chart serves it (metricsSecure), each on its own port.
		mu.Lock()
		metricsAddrs[host] = harness.FreeAddr(t)
		o.MetricsAddr, o.MetricsSecure = metricsAddrs[host], true
		mu.Unlock()
	}))
	t.Run("/metrics answers only the readers the API server allows", func(t *testing.T) {
		c := w.env.Clusters[0]
		mu.Lock()
		addr := metricsAddrs[c.Config.Host]
		mu.Unlock()
		checkSecureMetrics(t, kubernetes.NewForConfigOrDie(c.Config), addr, "controller")
	})
	t.Run("ClusterSetIP export is imported into every cluster", w.clusterSetIP)
	t.Run("headless export keeps hostnames", w.headless)
	t.Run("port and type conflicts: the oldest wins", w.conflicts)
	t.Run("unexport removes imports and cleans Cloud Map", w.unexport)
	t.Run("ExternalName and missing Services are rejected", w.invalid)
	t.Run("uninstall stops the chart's controller Deployment", func(t *testing.T) {
		t.Log(runCLI(t, "uninstall", "--kubeconfig", w.env.Kubeconfig, "--context", "cluster-1", "--namespace", releaseNS, "--phase", "stop", "--timeout", "1m"))
		dep := &appsv1.Deployment{}
		harness.Must(t, w.clients[0].Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: release + "-controller"}, dep))
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 0 {
			t.Errorf("the controller Deployment has %v replicas after uninstall's stop", dep.Spec.Replicas)
		}
	})
	t.Run("the MCS IAM policy allows every call made", func(t *testing.T) {
		p := loadPolicy(t, "mcs")
		for op := range calls.Snapshot() {
			if ok, _ := p.Allows("servicediscovery:" + op); !ok {
				t.Errorf("iam/mcs.json does not allow %s", op)
			}
		}
	})
}

// chartServiceAccount applies the chart rendered with values (its RBAC,
// ServiceAccount, Deployment) to every cluster and returns an option that
// runs a controller authenticated as the chart's ServiceAccount only (a
// TokenRequest token, no client certificate), electing its leader in the
// release's namespace as the chart does, and those configs by apiserver:
// a mode's e2e run with it proves the chart grants what the mode does.
func (w *world) chartServiceAccount(t *testing.T, ch *chart.Chart, values map[string]any) (func(*controller.Options), map[string]*rest.Config) {
	t.Helper()
	ctx := context.Background()
	objs, err := render(ch, values)
	harness.Must(t, err)
	configs := map[string]*rest.Config{}
	for i, cl := range w.clients {
		namespace(t, cl, releaseNS)
		harness.Must(t, applyAll(ctx, cl, objs))
		c := w.env.Clusters[i]
		cs := kubernetes.NewForConfigOrDie(c.Config)
		tok, err := cs.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, release, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](7200)}}, metav1.CreateOptions{})
		harness.Must(t, err)
		sa := rest.AnonymousClientConfig(c.Config)
		sa.BearerToken = tok.Status.Token
		configs[c.Config.Host] = sa
	}
	return func(o *controller.Options) {
		o.Config = configs[o.Config.Host]
		o.LeaderElect, o.LeaderElectionNamespace = true, releaseNS
	}, configs
}

// leastPrivilege asks the apiserver what the MCS-only ServiceAccount may do.
func leastPrivilege(t *testing.T, sa *rest.Config) {
	t.Helper()
	checkAccess(t, sa, []access{
		{authzv1.ResourceAttributes{Verb: "create", Resource: "namespaces"}, false},
		{authzv1.ResourceAttributes{Verb: "delete", Resource: "endpoints", Namespace: "default"}, false},
		{authzv1.ResourceAttributes{Verb: "list", Resource: "pods"}, false},
		{authzv1.ResourceAttributes{Verb: "get", Resource: "pods", Namespace: "default"}, false},
		{authzv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: releaseNS}, false},
		// What it needs, so that the denials above are the role's doing.
		{authzv1.ResourceAttributes{Verb: "create", Group: "multicluster.x-k8s.io", Resource: "serviceimports", Namespace: "default"}, true},
		// Imports are applied server-side (a patch); which Services it may
		// write is the admission policy's to say (writesOnlyItsOwn).
		{authzv1.ResourceAttributes{Verb: "patch", Resource: "services", Namespace: "default"}, true},
		{authzv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: releaseNS}, true},
		{authzv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "default"}, false},
	})
}

// writesOnlyItsOwn holds the MCS-only ServiceAccount (sa) to the chart's
// admission policy: RBAC lets it write every Service and EndpointSlice,
// the policy only those clustermap makes. (The scenarios that follow run
// the controllers under it: what they write passes.)
func writesOnlyItsOwn(t *testing.T, admin, sa *rest.Config) {
	t.Helper()
	ctx := context.Background()
	as, own := kubernetes.NewForConfigOrDie(sa), kubernetes.NewForConfigOrDie(admin)
	ns := "policy"
	_, err := own.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	harness.Must(t, err)
	svc := func(name string, labels map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	}
	// The slices name a Service that does not exist: the cluster's own
	// EndpointSlice controller deletes a slice it seems to manage for a
	// Service with a selector (user's), which raced the checks below.
	slice := func(name, manager string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: "no-such-service", discoveryv1.LabelManagedBy: manager}}, AddressType: discoveryv1.AddressTypeIPv4}
	}
	refused := func(what string, err error) { t.Helper(); refusedBy(t, release+"-writes", what, err) }
	_, err = own.CoreV1().Services(ns).Create(ctx, svc("user", nil), metav1.CreateOptions{})
	harness.Must(t, err)
	_, err = own.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("user-abcde", "endpointslice-controller.k8s.io"), metav1.CreateOptions{})
	harness.Must(t, err)
	// The policy is enforced once the API server has read it.
	harness.Eventually(t, 30*time.Second, "the chart's admission policy enforced", func() error {
		cur, err := own.CoreV1().Services(ns).Get(ctx, "user", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.Ports[0].Port++
		if _, err := as.CoreV1().Services(ns).Update(ctx, cur, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			return fmt.Errorf("the controller's ServiceAccount changed a user's Service: %v", err)
		}
		return nil
	})
	user, err := own.CoreV1().Services(ns).Get(ctx, "user", metav1.GetOptions{})
	harness.Must(t, err)
	changed := user.DeepCopy()
	changed.Labels = map[string]string{imports.LabelDerivedFor: "user"}
	_, err = as.CoreV1().Services(ns).Update(ctx, changed, metav1.UpdateOptions{})
	refused("marking a user's Service as derived", err)
	refused("deleting a user's Service", as.CoreV1().Services(ns).Delete(ctx, "user", metav1.DeleteOptions{}))
	// How the controller writes (server-side apply) is held to it too.
	_, err = as.CoreV1().Services(ns).Patch(ctx, "user", types.ApplyPatchType,
		[]byte(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"user"},"spec":{"sessionAffinity":"ClientIP"}}`),
		metav1.PatchOptions{FieldManager: "clustermap-import", Force: ptr.To(true)})
	refused("applying a user's Service", err)
	_, err = as.CoreV1().Services(ns).Create(ctx, svc("unmarked", nil), metav1.CreateOptions{})
	refused("creating an unmarked Service", err)
	refused("deleting the EndpointSlice controller's slice", as.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "user-abcde", metav1.DeleteOptions{}))
	_, err = as.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("stray", "endpointslice-controller.k8s.io"), metav1.CreateOptions{})
	refused("creating a slice managed by another", err)

	// What it makes: written, changed and deleted.
	derived, err := as.CoreV1().Services(ns).Create(ctx, svc("derived", map[string]string{imports.LabelDerivedFor: "user"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a derived Service: %v", err)
	}
	derived.Spec.Ports[0].Port = 8080
	if _, err := as.CoreV1().Services(ns).Update(ctx, derived, metav1.UpdateOptions{}); err != nil {
		t.Errorf("changing a derived Service: %v", err)
	}
	mine, err := as.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("mine", imports.ManagedBy), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating an imported slice: %v", err)
	}
	mine.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	_, err = as.DiscoveryV1().EndpointSlices(ns).Update(ctx, mine, metav1.UpdateOptions{})
	refused("handing an imported slice to another manager", err)
	if err := as.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "mine", metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting an imported slice: %v", err)
	}
	if err := as.CoreV1().Services(ns).Delete(ctx, "derived", metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting a derived Service: %v", err)
	}
}

// access is an action and whether a ServiceAccount may take it.
type access struct {
	attrs authzv1.ResourceAttributes
	want  bool
}

// checkAccess asks the apiserver what sa may do.
func checkAccess(t *testing.T, sa *rest.Config, checks []access) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(sa)
	for _, c := range checks {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(),
			&authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &c.attrs}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status.Allowed != c.want {
			t.Errorf("%s %s/%s in %q: allowed=%v, want %v", c.attrs.Verb, c.attrs.Group, c.attrs.Resource, c.attrs.Namespace, r.Status.Allowed, c.want)
		}
	}
}

// The chart's RBAC rules and CRDs are copies (make generate) of what
// controller-gen and mcs-api make for config/: they must not drift.
func TestChartCopiesAreCurrent(t *testing.T) {
	pairs := map[string]string{}
	for _, m := range []string{"mcs", "cloudmap-dns", "syndicate"} {
		pairs["../../config/rbac/"+m+"/role.yaml"] = chartDir + "/files/rbac/" + m + ".yaml"
	}
	bases, _ := filepath.Glob("../../config/crd/bases/*.yaml")
	for _, b := range bases {
		pairs[b] = chartDir + "/crds/" + filepath.Base(b)
	}
	for src, cp := range pairs {
		a, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(cp); err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s is not a copy of %s (make generate): %v", cp, src, err)
		}
	}
}

// operatorValues installs the chart in cluster-2 with every value operators
// asked for set (server-side apply, for real) and checks each does what it
// says: the identity from values, extra arguments and environment, a
// budget that lets a drain evict the only replica, a fixed DNS ClusterIP,
// the DNS server's scheduling and metrics, Helm's global key, and a user
// with the built-in edit role managing ServiceExports.
func (w *world) operatorValues(t *testing.T, ch *chart.Chart) {
	ctx := context.Background()
	cl, c := w.clients[1], w.env.Clusters[1]
	cs := kubernetes.NewForConfigOrDie(c.Config)
	prefix := netip.MustParsePrefix(c.ServiceCIDRs[0])
	ip := prefix.Addr().As4()
	ip[3] = 53
	dnsIP := netip.AddrFrom4(ip).String()
	harness.Must(t, cl.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "clustermap-dns-test"}, Value: 1000}))
	spread := map[string]any{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "clustermap-dns"}}}
	affinity := map[string]any{"podAntiAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{"weight": 100,
		"podAffinityTerm": map[string]any{"topologyKey": "kubernetes.io/hostname", "labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "clustermap-dns"}}}}}}}
	v := map[string]any{"region": "us-east-1", "replicas": 1,
		"global":            map[string]any{"imageRegistry": "registry.example"},
		"clusterProperties": map[string]any{"clusterId": c.ID, "clusterSetId": "clusterset-dev"},
		"extraArgs":         []any{"--zap-log-level=debug", "--allow-exec-plugins"},
		"extraEnv":          []any{map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"}},
		"serviceMonitor":    map[string]any{"enabled": true},
		"prometheusRule":    map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}},
		"grafanaDashboard":  map[string]any{"enabled": true},
		"dns": map[string]any{"enabled": true, "replicas": 1, "clusterIP": dnsIP, "priorityClassName": "clustermap-dns-test",
			"affinity": affinity, "topologySpreadConstraints": []any{spread},
			"extraArgs": []any{"--ttl=10"}, "extraEnv": []any{map[string]any{"name": "GOMAXPROCS", "value": "1"}}}}
	objs, err := render(ch, v)
	harness.Must(t, err)
	byKind := map[string]map[string]*unstructured.Unstructured{}
	for _, u := range objs {
		if byKind[u.GetKind()] == nil {
			byKind[u.GetKind()] = map[string]*unstructured.Unstructured{}
		}
		byKind[u.GetKind()][u.GetName()] = u
	}
	if len(byKind["ServiceMonitor"]) != 2 || byKind["Service"]["clustermap-dns-metrics"] == nil {
		t.Errorf("want a ServiceMonitor for the controller and the DNS server, and the DNS metrics Service: %v %v", keys(byKind["ServiceMonitor"]), keys(byKind["Service"]))
	}
	for name, p := range byKind["ClusterProperty"] {
		if p.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("ClusterProperty %s would go with helm uninstall", name)
		}
	}
	harness.Must(t, applyAll(ctx, cl, objs))

	// The alerts and the dashboard, as the Prometheus Operator and
	// Grafana's sidecar read them.
	rule := &unstructured.Unstructured{}
	rule.SetAPIVersion("monitoring.coreos.com/v1")
	rule.SetKind("PrometheusRule")
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: release}, rule))
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if rules, _, _ := unstructured.NestedSlice(groups[0].(map[string]any), "rules"); len(groups) != 1 || len(rules) != len(loadRules(t).Groups[0].Rules) ||
		rule.GetLabels()["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule: %d groups, labels %v; want the chart's alerts and the selector label", len(groups), rule.GetLabels())
	}
	board := &corev1.ConfigMap{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: release + "-dashboard"}, board))
	var d map[string]any
	if err := json.Unmarshal([]byte(board.Data["clustermap.json"]), &d); err != nil || board.Labels["grafana_dashboard"] != "1" || d["uid"] != "clustermap" {
		t.Errorf("dashboard ConfigMap: labels %v, JSON %v (uid %v)", board.Labels, err, d["uid"])
	}

	// The identity came from values (and equals what the cluster had).
	for name, want := range map[string]string{"cluster.clusterset.k8s.io": c.ID, "clusterset.k8s.io": "clusterset-dev"} {
		p := &unstructured.Unstructured{}
		p.SetAPIVersion("about.k8s.io/v1alpha1")
		p.SetKind("ClusterProperty")
		harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: name}, p))
		if got, _, _ := unstructured.NestedString(p.Object, "spec", "value"); got != want || !managedBy(p, "helm-test") {
			t.Errorf("ClusterProperty %s = %q, want %q applied by the chart", name, got, want)
		}
	}
	// Extra arguments come after the chart's (a repeated flag overrides);
	// the environment reaches the container.
	ctl := &appsv1.Deployment{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: release + "-controller"}, ctl))
	args := ctl.Spec.Template.Spec.Containers[0].Args
	if i := slices.Index(args, "--zap-log-level=debug"); i < slices.Index(args, "--zap-log-level=info") || !slices.Contains(args, "--allow-exec-plugins") {
		t.Errorf("controller args %v: want the extra ones after the chart's", args)
	}
	if env := ctl.Spec.Template.Spec.Containers[0].Env; !slices.ContainsFunc(env, func(e corev1.EnvVar) bool { return e.Name == "HTTPS_PROXY" }) {
		t.Errorf("controller env %v lacks HTTPS_PROXY", env)
	}
	dns := &appsv1.Deployment{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: release + "-dns"}, dns))
	ps := dns.Spec.Template.Spec
	if ps.PriorityClassName != "clustermap-dns-test" || ps.Affinity == nil || ps.Affinity.PodAntiAffinity == nil || len(ps.TopologySpreadConstraints) != 1 ||
		!slices.Contains(ps.Containers[0].Args, "--ttl=10") || len(ps.Containers[0].Env) != 1 {
		t.Errorf("DNS pod spec: priority %q, affinity %v, spread %v, args %v, env %v", ps.PriorityClassName, ps.Affinity, ps.TopologySpreadConstraints, ps.Containers[0].Args, ps.Containers[0].Env)
	}
	svc := &corev1.Service{}
	harness.Must(t, cl.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: release + "-dns"}, svc))
	if svc.Spec.ClusterIP != dnsIP {
		t.Errorf("DNS Service ClusterIP %s, want %s", svc.Spec.ClusterIP, dnsIP)
	}

	// A drain evicts the only controller replica: the budget allows one out.
	harness.Eventually(t, 60*time.Second, "the single controller replica can be evicted", func() error {
		pods, err := cs.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=clustermap-controller"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				return cs.PolicyV1().Evictions(releaseNS).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: releaseNS, Name: p.Name}})
			}
		}
		return fmt.Errorf("no controller pod yet")
	})

	// The edit role, aggregated, lets a namespace's user export; view
	// reads only.
	namespace(t, cl, "team")
	for user, role := range map[string]string{"alice": "edit", "bob": "view"} {
		harness.Must(t, cl.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}))
	}
	for _, c := range []struct {
		user, verb, resource string
		want                 bool
	}{
		{"alice", "create", "serviceexports", true}, {"alice", "delete", "serviceexports", true}, {"alice", "list", "serviceimports", true},
		{"alice", "create", "serviceimports", false},
		{"bob", "get", "serviceexports", true}, {"bob", "list", "serviceimports", true}, {"bob", "create", "serviceexports", false},
	} {
		harness.Eventually(t, 30*time.Second, fmt.Sprintf("%s may%s %s %s", c.user, map[bool]string{false: " not"}[c.want], c.verb, c.resource), func() error {
			r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: c.user,
				ResourceAttributes: &authzv1.ResourceAttributes{Namespace: "team", Verb: c.verb, Group: "multicluster.x-k8s.io", Resource: c.resource}}}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			if r.Status.Allowed != c.want {
				return fmt.Errorf("allowed=%v", r.Status.Allowed)
			}
			return nil
		})
	}
}

func keys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// managedBy says whether manager owns fields of o.
func managedBy(o *unstructured.Unstructured, manager string) bool {
	return slices.ContainsFunc(o.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool { return f.Manager == manager })
}

// monitoringCRDs are the Prometheus Operator's ServiceMonitor and
// PrometheusRule CRDs (make tools copies them from the pinned module), so
// that the chart's monitoring objects are checked against the real schemas.
func monitoringCRDs(t *testing.T) []*unstructured.Unstructured {
	return loadObjects(t, filepath.Join(devenv.BinDir(), "crds", "monitoring"), 2)
}

// loadObjects reads the n YAML files of dir (each one object) that make
// tools put there.
func loadObjects(t *testing.T, dir string, n int) []*unstructured.Unstructured {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) != n {
		t.Fatalf("want %d objects in %s (make tools), found %v", n, dir, files)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		raw, err := os.ReadFile(f)
		harness.Must(t, err)
		m := map[string]any{}
		harness.Must(t, yaml.Unmarshal(raw, &m))
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// Every series scraped through the chart's ServiceMonitors carries the
// cluster's name in `cluster`, which the alerts aggregate by: from
// serviceMonitor.cluster, else the cluster id, else nothing (left to
// Prometheus's external labels).
func TestChartClusterLabel(t *testing.T) {
	ch := loadChart(t)
	for _, c := range []struct {
		what             string
		clusterID, label string
		want             string
	}{
		{"the cluster id by default", "cluster-7", "", "cluster-7"},
		{"serviceMonitor.cluster over the id", "cluster-7", "prod-east-7", "prod-east-7"},
		{"neither: no label", "", "", ""},
	} {
		v := modeValues(true, false, false, true)
		v["clusterProperties"] = map[string]any{"clusterId": c.clusterID}
		v["serviceMonitor"] = map[string]any{"enabled": true, "cluster": c.label}
		objs, err := render(ch, v)
		harness.Must(t, err)
		monitors := 0
		for _, u := range objs {
			if u.GetKind() != "ServiceMonitor" {
				continue
			}
			monitors++
			endpoints, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
			var got []any
			for _, e := range endpoints {
				rl, _, _ := unstructured.NestedSlice(e.(map[string]any), "relabelings")
				got = append(got, rl...)
			}
			var want []any
			if c.want != "" {
				want = []any{map[string]any{"action": "replace", "targetLabel": "cluster", "replacement": c.want}}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: ServiceMonitor %s relabels %v, want %v", c.what, u.GetName(), got, want)
			}
		}
		if monitors != 2 {
			t.Errorf("%s: %d ServiceMonitors, want the controller's and the DNS server's", c.what, monitors)
		}
	}
}

// The chart's defaults for where its pods run and what reaches them: both
// Deployments spread over zones and nodes (each constraint selecting its
// own pods) at system-cluster-critical priority; image.digest pins the
// image; the optional NetworkPolicies select each Deployment's pods and
// name only ports their containers have.
func TestChartPodDefaults(t *testing.T) {
	ch := loadChart(t)
	digest := "sha256:" + strings.Repeat("ab", 32)
	v := modeValues(true, false, false, true)
	v["image"] = map[string]any{"repository": "registry.example/clustermap", "digest": digest}
	v["networkPolicy"] = map[string]any{"enabled": true}
	objs, err := render(ch, v)
	harness.Must(t, err)
	pods := map[string]corev1.PodTemplateSpec{}
	var policies []*unstructured.Unstructured
	for _, u := range objs {
		switch u.GetKind() {
		case "Deployment":
			d := &appsv1.Deployment{}
			harness.Must(t, runtimeConvert(u, d))
			pods[d.Name] = d.Spec.Template
			spec := d.Spec.Template.Spec
			if spec.PriorityClassName != "system-cluster-critical" {
				t.Errorf("%s: priorityClassName %q, want system-cluster-critical", d.Name, spec.PriorityClassName)
			}
			var keys []string
			for _, c := range spec.TopologySpreadConstraints {
				sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
				harness.Must(t, err)
				if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("%s: the %s spread constraint does not select its pods", d.Name, c.TopologyKey)
				}
				keys = append(keys, c.TopologyKey)
			}
			if !slices.Equal(keys, []string{"topology.kubernetes.io/zone", "kubernetes.io/hostname"}) {
				t.Errorf("%s: spread over %v, want zones then nodes", d.Name, keys)
			}
			if img := spec.Containers[0].Image; img != "registry.example/clustermap@"+digest {
				t.Errorf("%s: image %s, want it by digest", d.Name, img)
			}
		case "NetworkPolicy":
			policies = append(policies, u)
		}
	}
	if len(pods) != 2 || len(policies) != 2 {
		t.Fatalf("%d Deployments and %d NetworkPolicies, want the controller's and the DNS server's", len(pods), len(policies))
	}
	for _, u := range policies {
		np := &networkingv1.NetworkPolicy{}
		harness.Must(t, runtimeConvert(u, np))
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		harness.Must(t, err)
		var selected []string
		for name, tmpl := range pods {
			if sel.Matches(labels.Set(tmpl.Labels)) {
				selected = append(selected, name)
				ports := map[string]bool{}
				for _, p := range tmpl.Spec.Containers[0].Ports {
					ports[p.Name] = true
				}
				for _, in := range np.Spec.Ingress {
					for _, p := range in.Ports {
						if p.Port.Type == intstr.String && !ports[p.Port.StrVal] {
							t.Errorf("NetworkPolicy %s admits port %q, which %s has not", np.Name, p.Port.StrVal, name)
						}
					}
				}
			}
		}
		if len(selected) != 1 || len(np.Spec.Egress) < 2 {
			t.Errorf("NetworkPolicy %s selects %v (want one Deployment's pods), egress %v", np.Name, selected, np.Spec.Egress)
		}
		// AWS credentials: the EKS Pod Identity agent (both families) and
		// instance metadata, over HTTP.
		for _, ip := range []string{"169.254.170.23", "fd00:ec2::23", "169.254.169.254"} {
			if !egressReaches(np, netip.MustParseAddr(ip), 80) {
				t.Errorf("NetworkPolicy %s lets no traffic out to %s:80: %v", np.Name, ip, np.Spec.Egress)
			}
		}
	}

	// Off: no policy; [] and "": no spread, the default priority.
	v = modeValues(true, false, false, true)
	v["topologySpreadConstraints"] = []any{}
	v["priorityClassName"] = ""
	v["networkPolicy"] = map[string]any{"enabled": false}
	objs, err = render(ch, v)
	harness.Must(t, err)
	for _, u := range objs {
		if u.GetKind() == "NetworkPolicy" {
			t.Errorf("NetworkPolicy %s rendered while networkPolicy.enabled is false", u.GetName())
		}
		if u.GetName() == release+"-controller" && u.GetKind() == "Deployment" {
			spec, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
			if spec["priorityClassName"] != nil || spec["topologySpreadConstraints"] != nil {
				t.Errorf("the controller keeps priority %v and spread %v when both are unset", spec["priorityClassName"], spec["topologySpreadConstraints"])
			}
		}
	}
}

func runtimeConvert(u *unstructured.Unstructured, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
}

// egressReaches says whether a NetworkPolicy's egress lets TCP out to
// addr:port (a rule without peers reaches anywhere).
func egressReaches(np *networkingv1.NetworkPolicy, addr netip.Addr, port int) bool {
	for _, r := range np.Spec.Egress {
		portOK := len(r.Ports) == 0
		for _, p := range r.Ports {
			portOK = portOK || p.Port != nil && p.Port.IntValue() == port && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP)
		}
		to := len(r.To) == 0
		for _, peer := range r.To {
			if peer.IPBlock != nil {
				if prefix, err := netip.ParsePrefix(peer.IPBlock.CIDR); err == nil && prefix.Contains(addr) {
					to = true
				}
			}
		}
		if portOK && to {
			return true
		}
	}
	return false
}

//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
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
// templates, split into objects; NOTES.txt is not one.
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
			if len(m) > 0 {
				objs = append(objs, &unstructured.Unstructured{Object: m})
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
		"serviceMonitor": map[string]any{"enabled": true}, "serviceAccount": map[string]any{"roleArn": "arn:aws:iam::123456789012:role/clustermap"}}
}

func TestChart(t *testing.T) {
	w := worldWithoutControllers(t, 2, cloudmaplocal.Options{})
	ch := loadChart(t)
	for _, cl := range w.clients {
		namespace(t, cl, releaseNS)
		harness.Must(t, applyAll(context.Background(), cl, crds(t, ch)))
	}
	t.Run("every mode combination renders and applies (server dry run)", func(t *testing.T) { everyMode(t, w, ch) })
	t.Run("bad values fail with a clear message", func(t *testing.T) { badValues(t, ch) })
	t.Run("accounts and Regions reach the controller", func(t *testing.T) { accountsValues(t, ch) })
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
			// The Prometheus Operator's CRD is not on dev clusters: the
			// ServiceMonitor is checked for its shape only.
			if u.GetKind() == "ServiceMonitor" {
				if u.GetAPIVersion() != "monitoring.coreos.com/v1" {
					t.Errorf("ServiceMonitor %s", u.GetAPIVersion())
				}
				continue
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
		{"a bad expiry", func(v map[string]any) { v["cloudMap"] = map[string]any{"staleClusterExpiry": "a day"} }, "staleClusterExpiry"},
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

func accountsValues(t *testing.T, ch *chart.Chart) {
	v := modeValues(true, false, false, false)
	v["cloudMap"] = map[string]any{"ownerAccount": "111111111111", "regions": []any{"us-east-1", "eu-west-1"}, "staleClusterExpiry": "2h"}
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
	for _, want := range []string{"--cloudmap-owner-account=111111111111", "--regions=us-east-1,eu-west-1", "--stale-cluster-expiry=2h"} {
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
	objs, err := render(ch, map[string]any{"region": "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	configs := map[string]*rest.Config{} // by apiserver
	for i, cl := range w.clients {
		harness.Must(t, applyAll(ctx, cl, objs))
		c := w.env.Clusters[i]
		cs := kubernetes.NewForConfigOrDie(c.Config)
		tok, err := cs.CoreV1().ServiceAccounts(releaseNS).CreateToken(ctx, release, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sa := rest.AnonymousClientConfig(c.Config)
		sa.BearerToken = tok.Status.Token
		configs[c.Config.Host] = sa
		if i == 0 {
			leastPrivilege(t, sa)
		}
	}
	calls := &cloudmapclient.Calls{}
	t.Cleanup(w.startControllers(t, func(o *controller.Options) {
		o.Config = configs[o.Config.Host]
		o.LeaderElect, o.LeaderElectionNamespace = true, releaseNS
		o.OnCloudMapCall = calls.Record
	}))
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
			if ok, _ := p.allows(op); !ok {
				t.Errorf("iam/mcs.json does not allow %s", op)
			}
		}
	})
}

// leastPrivilege asks the apiserver what the MCS-only ServiceAccount may do.
func leastPrivilege(t *testing.T, sa *rest.Config) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(sa)
	for _, c := range []struct {
		attrs authzv1.ResourceAttributes
		want  bool
	}{
		{authzv1.ResourceAttributes{Verb: "create", Resource: "namespaces"}, false},
		{authzv1.ResourceAttributes{Verb: "delete", Resource: "endpoints", Namespace: "default"}, false},
		{authzv1.ResourceAttributes{Verb: "list", Resource: "pods"}, false},
		{authzv1.ResourceAttributes{Verb: "get", Resource: "pods", Namespace: "default"}, false},
		{authzv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: releaseNS}, false},
		{authzv1.ResourceAttributes{Verb: "patch", Resource: "services", Namespace: "default"}, false},
		// What it needs, so that the denials above are the role's doing.
		{authzv1.ResourceAttributes{Verb: "create", Group: "multicluster.x-k8s.io", Resource: "serviceimports", Namespace: "default"}, true},
		{authzv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: releaseNS}, true},
		{authzv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "default"}, false},
	} {
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

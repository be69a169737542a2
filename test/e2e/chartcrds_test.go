//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

var chartCRDs = []string{"clusterproperties.about.k8s.io", "serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"}

// crds.enabled, turned on as docs/install.md says on a release installed
// the default way: the upgrade takes the CRDs over (--take-ownership) and
// brings the older chart's CRD up to date (Helm never upgrades crds/);
// helm uninstall keeps them with crds.keep and deletes them without. --skip-crds with clusterProperties
// is refused before anything is made, saying why.
func TestChartCRDs(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	c := env.Clusters[0]
	ctx := context.Background()
	cl := harness.ClientWith(t, c.Config, devenv.Scheme)
	crdsGone := func() {
		harness.Eventually(t, time.Minute, "CRDs gone", func() error {
			for _, name := range chartCRDs {
				if err := cl.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("%s: %v", name, err)
				}
			}
			return nil
		})
	}
	// A cluster with no clustermap CRDs yet.
	for _, name := range chartCRDs {
		harness.Must(t, cl.Delete(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	}
	crdsGone()

	real := loadChart(t)
	// The same chart, one release older: a CRD description differs.
	const marker = "an older chart's CRD"
	old := loadChart(t)
	changed := false
	for i, f := range old.Files {
		if f.Name == "crds/multicluster.x-k8s.io_serviceexports.yaml" {
			data := strings.Replace(string(f.Data), "description: ", "description: "+marker+" ", 1)
			old.Files[i] = &chart.File{Name: f.Name, Data: []byte(data)}
			changed = true
		}
	}
	if !changed {
		t.Fatal("the chart has no crds/multicluster.x-k8s.io_serviceexports.yaml")
	}
	cfg := helmAction(t, env, c, releaseNS)
	identity := map[string]any{"clusterId": c.ID, "clusterSetId": devenv.DefaultClusterSet}
	base := map[string]any{"region": "us-west-2", "uninstallHook": map[string]any{"enabled": false}, "clusterProperties": identity}
	with := func(crds map[string]any) map[string]any {
		v := maps.Clone(base)
		v["crds"] = crds
		return v
	}
	install := func(ch *chart.Chart, skipCRDs bool, values map[string]any) error {
		in := action.NewInstall(cfg)
		in.ReleaseName, in.Namespace, in.CreateNamespace, in.SkipCRDs = release, releaseNS, true, skipCRDs
		_, err := in.RunWithContext(ctx, ch, values)
		return err
	}
	description := func() (string, string) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		harness.Must(t, cl.Get(ctx, client.ObjectKey{Name: "serviceexports.multicluster.x-k8s.io"}, crd))
		return crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Description, crd.Annotations["meta.helm.sh/release-name"]
	}

	// --skip-crds: the ClusterProperties could not be mapped.
	err := install(real, true, with(map[string]any{"enabled": true}))
	if err == nil || !strings.Contains(err.Error(), "clusterProperties need the ClusterProperty CRD") {
		t.Fatalf("--skip-crds with crds.enabled and clusterProperties: %v; want it refused, saying why", err)
	}
	crdsGone()

	// An install of the older chart as it is installed by default: Helm
	// makes crds/, which the release does not hold.
	harness.Must(t, install(old, false, base))
	if d, owner := description(); !strings.Contains(d, marker) || owner != "" {
		t.Fatalf("installed CRD description %q (release %q), want the older chart's, held by none", d, owner)
	}
	// docs/install.md's upgrade that turns crds.enabled on.
	step := codeBlock(t, "../../docs/install.md", "--take-ownership")
	set, ns := helmFlags(t, step)
	if ns != releaseNS || !strings.Contains(step, "--reset-then-reuse-values") || fmt.Sprint(set) != "map[crds:map[enabled:true]]" {
		t.Fatalf("docs/install.md's crds.enabled upgrade changed (%s): bring this test to it", step)
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.ResetThenReuseValues, up.TakeOwnership = ns, true, true
	_, err = up.RunWithContext(ctx, release, real, set)
	harness.Must(t, err)
	if d, owner := description(); strings.Contains(d, marker) || owner != release {
		t.Errorf("after the upgrade: CRD description %q (release %q), want the chart's, held by %s", d, owner, release)
	}

	un := action.NewUninstall(cfg)
	un.Timeout = time.Minute
	_, err = un.Run(release)
	harness.Must(t, err)
	for _, name := range chartCRDs {
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{}); err != nil {
			t.Errorf("crds.keep: CRD %s after helm uninstall: %v", name, err)
		}
	}
	// crds.keep=false: they go with the release.
	harness.Must(t, install(real, false, with(map[string]any{"enabled": true, "keep": false})))
	_, err = un.Run(release)
	harness.Must(t, err)
	crdsGone()
}

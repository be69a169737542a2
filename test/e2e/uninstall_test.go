//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/test/harness"
)

func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(devenv.BinDir(), "clustermap"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("clustermap %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Every mode publishes, then clustermap uninstall withdraws and cleans:
// the CRDs then go at once, and nothing clustermap made is left in the
// clusters or in Cloud Map.
func TestUninstall(t *testing.T) {
	w := worldWithoutControllers(t, 2, cloudmaplocal.Options{})
	w.allNamespaces(t, "shop")
	dirs, err := w.env.PeerDirs(context.Background(), t.TempDir(), replication.PeerAccess{Namespaces: []string{"shop"}})
	harness.Must(t, err)
	stop := w.startControllers(t, func(o *controller.Options) {
		w.asPeer(o, dirs)
		o.MCS, o.CloudMapDNS, o.Syndicate, o.PeerGrace = true, true, true, 3*time.Second
		o.Namespaces = []string{"shop"}
	})
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
		}
	})
	ctx := context.Background()
	c := w.cloudMap(t)
	cloudmaptest.Namespace(t, c, "apps")

	// MCS: web exported from cluster-1 (and, by replication, a replica of
	// it in cluster-2); Cloud Map DNS: api from cluster-2.
	w.exportApp(t, "shop", "web", 2)
	annotated(t, w.clients[1], "shop", "api", 2, "apps", "api")
	harness.Eventually(t, importDeadline, "api registered", serviceCondition(w.clients[1], "shop", "api", "True/Registered"))
	harness.Eventually(t, importDeadline, "web replicated to cluster-2", func() error {
		svc := &corev1.Service{}
		if err := w.clients[1].Get(ctx, client.ObjectKey{Namespace: "shop", Name: "web"}, svc); err != nil {
			return err
		}
		if svc.Labels[replication.LabelSourceCluster] != "cluster-1" {
			return fmt.Errorf("web in cluster-2 is not a replica: %v", svc.Labels)
		}
		return nil
	})
	if n := instanceCount(t, c); n == 0 {
		t.Fatal("nothing in Cloud Map to withdraw")
	}

	kc := w.env.Kubeconfig
	t.Log(runCLI(t, "uninstall", "--kubeconfig", kc, "--all-contexts", "--phase", "withdraw", "--timeout", "2m"))
	stop()
	stopped = true
	t.Log(runCLI(t, "uninstall", "--kubeconfig", kc, "--all-contexts", "--phase", "stop"))
	t.Log(runCLI(t, "uninstall", "--kubeconfig", kc, "--all-contexts", "--phase", "cleanup"))

	for i, cl := range w.clients {
		id := w.env.Clusters[i].ID
		crdClient, err := client.New(w.env.Clusters[i].Config, client.Options{Scheme: devenv.Scheme})
		harness.Must(t, err)
		for _, name := range []string{"serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"} {
			harness.Must(t, client.IgnoreNotFound(crdClient.Delete(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}})))
		}
		harness.Eventually(t, 60*time.Second, id+": CRDs gone", func() error {
			for _, name := range []string{"serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"} {
				if err := crdClient.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("CRD %s still there (%v)", name, err)
				}
			}
			return nil
		})
		svcs := &corev1.ServiceList{}
		harness.Must(t, cl.List(ctx, svcs, client.InNamespace("shop")))
		for _, s := range svcs.Items {
			if len(s.Finalizers) > 0 || s.Labels[replication.LabelSourceCluster] != "" || s.Labels[imports.LabelDerivedFor] != "" {
				t.Errorf("%s: Service %s left with finalizers %v, labels %v", id, s.Name, s.Finalizers, s.Labels)
			}
			if _, ok := s.Annotations[cloudmapdns.AnnotationHostname]; ok {
				t.Errorf("%s: Service %s still asks for Cloud Map DNS", id, s.Name)
			}
		}
		for _, m := range []string{imports.ManagedBy, replication.ManagedBy} {
			sl := &discoveryv1.EndpointSliceList{}
			harness.Must(t, cl.List(ctx, sl, client.MatchingLabels{discoveryv1.LabelManagedBy: m}))
			if len(sl.Items) > 0 {
				t.Errorf("%s: %d EndpointSlices of %s left", id, len(sl.Items), m)
			}
		}
		if err := cl.Get(ctx, client.ObjectKey{Namespace: kube.DefaultStatusNamespace, Name: statuslease.LeaseName}, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s: the status Lease is left (%v)", id, err)
		}
	}
	// Cloud Map: no instance left, the namespace and services clustermap
	// created gone, the user's namespace kept.
	if n := instanceCount(t, c); n != 0 {
		t.Errorf("%d Cloud Map instances left", n)
	}
	nss, err := c.ListNamespaces(ctx, &sd.ListNamespacesInput{})
	harness.Must(t, err)
	var names []string
	for _, ns := range nss.Namespaces {
		names = append(names, aws.ToString(ns.Name))
	}
	if strings.Join(names, ",") != "apps" {
		t.Errorf("Cloud Map namespaces left %v, want only the user's apps", names)
	}
	svcs, err := c.ListServices(ctx, &sd.ListServicesInput{})
	harness.Must(t, err)
	if len(svcs.Services) != 0 {
		t.Errorf("%d Cloud Map services left, want those clustermap created gone", len(svcs.Services))
	}
}

func instanceCount(t *testing.T, c *sd.Client) int {
	t.Helper()
	svcs, err := c.ListServices(context.Background(), &sd.ListServicesInput{})
	harness.Must(t, err)
	n := 0
	for _, s := range svcs.Services {
		out, err := c.ListInstances(context.Background(), &sd.ListInstancesInput{ServiceId: s.Id})
		harness.Must(t, err)
		n += len(out.Instances)
	}
	return n
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/internal/withdraw"
	"github.com/clustermap/clustermap/test/harness"
)

// runCLI runs the clustermap CLI, with the local emulator's credentials
// for the commands that call Cloud Map.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(devenv.BinDir(), "clustermap"), args...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local", "AWS_EC2_METADATA_DISABLED=true")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("clustermap %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Every mode publishes, then clustermap uninstall withdraws and cleans:
// the CRDs then go at once, and nothing clustermap made is left in the
// clusters or in Cloud Map. What users own stays as they made it: every
// ServiceExport (the one clustermap served, one in kube-system, one
// outside --namespaces, one another controller serves), the Cloud Map DNS
// annotations, and another writer's Cloud Map service and instance.
func TestUninstall(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
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
	appsID := cloudmaptest.Namespace(t, c, "apps")
	// Another writer's service and instance in the user's namespace (an
	// ECS service, say).
	legacy, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("legacy"), NamespaceId: aws.String(appsID)})
	harness.Must(t, err)
	cloudmaptest.Written(t, c, func(ctx context.Context) (*string, error) {
		out, err := c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: legacy.Service.Id, InstanceId: aws.String("ecs-task-1"),
			Attributes: map[string]string{"AWS_INSTANCE_IPV4": "10.9.0.1"}})
		if err != nil {
			return nil, err
		}
		return out.OperationId, nil
	})
	// ServiceExports clustermap does not serve: in kube-system and in a
	// namespace outside --namespaces (held by another controller).
	const otherFinalizer = "example.com/other-mcs-controller"
	namespace(t, w.clients[0], "other")
	unserved := []client.ObjectKey{{Namespace: "kube-system", Name: "kube-dns"}, {Namespace: "other", Name: "theirs"}}
	for _, k := range unserved {
		se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
		if k.Namespace == "other" {
			se.Finalizers = []string{otherFinalizer}
		}
		harness.Must(t, w.clients[0].Create(ctx, se))
	}

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

	// Every ServiceExport stays: the one clustermap served let go of
	// (no finalizer, Ready says why), the others untouched.
	for _, k := range append(unserved, client.ObjectKey{Namespace: "shop", Name: "web"}) {
		se := &mcsv1beta1.ServiceExport{}
		if err := w.clients[0].Get(ctx, k, se); err != nil {
			t.Errorf("ServiceExport %s after uninstall: %v; want it kept", k, err)
			continue
		}
		switch k.Namespace {
		case "shop":
			ready := meta.FindStatusCondition(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionReady))
			if len(se.Finalizers) > 0 || ready == nil || ready.Reason != string(export.ReasonWithdrawn) {
				t.Errorf("ServiceExport %s: finalizers %v, Ready %+v; want none and Withdrawn", k, se.Finalizers, ready)
			}
		case "other":
			if !slices.Equal(se.Finalizers, []string{otherFinalizer}) || len(se.Status.Conditions) > 0 {
				t.Errorf("ServiceExport %s another controller serves: finalizers %v, conditions %v; want its own only, untouched", k, se.Finalizers, se.Status.Conditions)
			}
			// The other controller lets go, so that the CRD can go below.
			base := se.DeepCopy()
			se.Finalizers = nil
			harness.Must(t, w.clients[0].Patch(ctx, se, client.MergeFrom(base)))
		default:
			if len(se.Finalizers) > 0 || len(se.Status.Conditions) > 0 {
				t.Errorf("ServiceExport %s outside clustermap's namespaces: finalizers %v, conditions %v; want it untouched", k, se.Finalizers, se.Status.Conditions)
			}
		}
	}
	// The annotated Service keeps its annotations, without clustermap's.
	api := &corev1.Service{}
	harness.Must(t, w.clients[1].Get(ctx, client.ObjectKey{Namespace: "shop", Name: "api"}, api))
	if api.Annotations[cloudmapdns.AnnotationHostname] != "api" || api.Annotations[cloudmapdns.AnnotationNamespace] != "apps" {
		t.Errorf("Service shop/api lost its Cloud Map DNS annotations: %v", api.Annotations)
	}
	for k := range api.Annotations {
		if strings.HasPrefix(k, "cloudmap.clustermap.io/") {
			t.Errorf("Service shop/api keeps clustermap's annotation %s", k)
		}
	}

	for i, cl := range w.clients {
		id := w.env.Clusters[i].ID
		crdClient := harness.ClientWith(t, w.env.Clusters[i].Config, devenv.Scheme)
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
		}
		for _, m := range []string{imports.ManagedBy, replication.ManagedBy} {
			sl := &discoveryv1.EndpointSliceList{}
			harness.Must(t, cl.List(ctx, sl, client.MatchingLabels{discoveryv1.LabelManagedBy: m}))
			if len(sl.Items) > 0 {
				t.Errorf("%s: %d EndpointSlices of %s left", id, len(sl.Items), m)
			}
		}
		for _, name := range []string{statuslease.LeaseName, withdraw.LeaseName} {
			if err := cl.Get(ctx, client.ObjectKey{Namespace: kube.DefaultStatusNamespace, Name: name}, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s: the Lease %s is left (%v)", id, name, err)
			}
		}
	}
	// Cloud Map: only the other writer's instance left, the namespace and
	// services clustermap created gone, the user's namespace and the other
	// writer's service kept.
	if n := instanceCount(t, c); n != 1 {
		t.Errorf("%d Cloud Map instances left, want only the other writer's", n)
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
	if len(svcs.Services) != 1 || aws.ToString(svcs.Services[0].Name) != "legacy" {
		t.Errorf("%d Cloud Map services left, want only the other writer's legacy (those clustermap created gone)", len(svcs.Services))
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

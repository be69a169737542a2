//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

// TestMigrateFromAWSController switches cluster-1 from the AWS Cloud Map
// MCS controller to clustermap while cluster-2, already on clustermap,
// imports its service: cluster-1 starts with the AWS controller's CRDs
// (v1alpha1 only, as sigs.k8s.io/mcs-api v0.1.0 serves), a v1alpha1
// ServiceExport with that controller's finalizer, its Cloud Map records,
// and a ServiceImport it made with its derived Service and EndpointSlices.
// The steps of docs/migrate-from-aws-controller.md follow; cluster-2's
// import is sampled throughout and never misses an endpoint.
func TestMigrateFromAWSController(t *testing.T) {
	inParallel(t)
	ctx := context.Background()
	w := worldWithoutControllers(t, 2, cloudmaplocal.Options{})
	one, two := w.clients[0], w.clients[1]
	const ns = "legacy"

	// cluster-1 as the AWS controller left it: its CRDs.
	replaceCRDs(t, one, loadObjects(t, filepath.Join(devenv.BinDir(), "crds", "mcs-v1alpha1"), 2))
	w.allNamespaces(t, ns)
	app(t, one, ns, "web", 3, false, httpPort(80, 8080))
	ips := waitPods(t, one, ns, "web", 3)
	legacyExport := &unstructured.Unstructured{}
	legacyExport.SetAPIVersion("multicluster.x-k8s.io/v1alpha1")
	legacyExport.SetKind("ServiceExport")
	legacyExport.SetNamespace(ns)
	legacyExport.SetName("web")
	legacyExport.SetFinalizers([]string{export.AWSFinalizer})
	harness.Must(t, one.Create(ctx, legacyExport))
	awsRecords(t, w.cloudMap(t), ns, "web", "cluster-1", ips)

	// cluster-2 on clustermap from the start: it exports api, which the
	// AWS controller imported into cluster-1, and imports web.
	stop2 := startOne(t, w, 1)
	defer stop2()
	app(t, two, ns, "api", 2, false, httpPort(80, 8080))
	exportService(t, two, ns, "api")
	apiIPs := waitPods(t, two, ns, "api", 2)
	awsImport(t, one, ns, "api", "10.99.0.1")
	harness.Eventually(t, importDeadline, "cluster-2 imports web from the AWS controller's records", func() error {
		s, err := importSlices(two, ns, "web")
		if err == nil && !sameIPs(readyIPs(s), ips) {
			err = fmt.Errorf("ready %v, want %v", readyIPs(s), ips)
		}
		return err
	})

	// From here on, cluster-2 must always have every endpoint of web.
	var mu sync.Mutex
	samples, missing := 0, []string{}
	sampling, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-sampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
			s, err := importSlices(two, ns, "web")
			mu.Lock()
			samples++
			if err != nil || !containsAll(readyIPs(s), ips) {
				missing = append(missing, fmt.Sprintf("%s: %v (%v)", time.Now().Format("15:04:05.000"), readyIPs(s), err))
			}
			mu.Unlock()
		}
	}()

	// Step 1: the CRDs serve v1beta1 too; the ServiceExport is kept.
	ch := loadChart(t)
	harness.Must(t, applyAll(ctx, one, crds(t, ch)))
	// A new client: the old one's discovery knew v1alpha1 only.
	one, err := client.New(w.env.Clusters[0].Config, client.Options{Scheme: kube.Scheme()})
	harness.Must(t, err)
	harness.Eventually(t, 30*time.Second, "the v1alpha1 ServiceExport read as v1beta1", func() error {
		se := &mcsv1beta1.ServiceExport{}
		if err := one.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, se); err != nil {
			return err
		}
		if !slices.Contains(se.Finalizers, export.AWSFinalizer) {
			return fmt.Errorf("finalizers %v", se.Finalizers)
		}
		return nil
	})
	// Step 2 (the AWS controller scaled to 0) has nothing to stop here.
	// Step 3: clustermap in cluster-1.
	stop1 := startOne(t, w, 0)
	defer stop1()
	harness.Eventually(t, importDeadline, "cluster-1's export taken over", func() error {
		se := &mcsv1beta1.ServiceExport{}
		if err := one.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, se); err != nil {
			return err
		}
		if c := condition(one, ns, "web", "Ready"); c != "True/Exported" || slices.Contains(se.Finalizers, export.AWSFinalizer) || !slices.Contains(se.Finalizers, export.Finalizer) {
			return fmt.Errorf("Ready %s, finalizers %v", c, se.Finalizers)
		}
		return nil
	})
	harness.Eventually(t, 10*time.Second, "an AdoptedFromAWSController Event on the export", wantEvent(one, ns, "web", "AdoptedFromAWSController", corev1.EventTypeNormal, "finalizer removed"))
	// Adopted, not duplicated: the AWS controller's records of cluster-1
	// gave way to clustermap's (one per endpoint, and the service record).
	harness.Eventually(t, importDeadline, "one set of Cloud Map records for cluster-1", func() error {
		out, err := w.cloudMap(t).DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String(ns), ServiceName: aws.String("web"),
			QueryParameters: map[string]string{cloudmap.AttrClusterID: "cluster-1"}})
		if err != nil {
			return err
		}
		var records []cloudmap.Instance
		for _, in := range out.Instances {
			records = append(records, cloudmap.Instance{ID: aws.ToString(in.InstanceId), Attrs: in.Attributes})
			if strings.HasPrefix(in.Attributes[cloudmap.AttrController], "aws-cloud-map-mcs-controller") {
				return fmt.Errorf("the AWS controller's record %s is still there", aws.ToString(in.InstanceId))
			}
		}
		// clustermap's records, in whichever format: the endpoints once.
		exports := cloudmap.Decode(registry.Key{Namespace: ns, Name: "web"}, records)
		if len(exports) != 1 || exports[0].Foreign || len(exports[0].Endpoints) != len(ips) {
			return fmt.Errorf("%d instances decode to %+v, want clustermap's export of %d endpoints", len(records), exports, len(ips))
		}
		return nil
	})
	// cluster-1's import of api: clustermap's, the AWS leftovers gone.
	harness.Eventually(t, importDeadline, "cluster-1's import of api taken over", func() error {
		si, err := getImport(one, ns, "api")
		if err != nil {
			return err
		}
		if si.Labels[imports.LabelManagedBy] != "clustermap" || si.Annotations[imports.AWSDerivedServiceAnnotation] != "" {
			return fmt.Errorf("labels %v, annotations %v", si.Labels, si.Annotations)
		}
		if err := one.Get(ctx, client.ObjectKey{Namespace: ns, Name: "imported-legacyapi"}, &corev1.Service{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the AWS derived Service: %v", err)
		}
		all := &discoveryv1.EndpointSliceList{}
		if err := one.List(ctx, all, client.InNamespace(ns), client.MatchingLabels{mcsv1beta1.LabelServiceName: "api"}); err != nil {
			return err
		}
		var got []string
		for _, s := range all.Items {
			if s.Labels[discoveryv1.LabelManagedBy] != imports.ManagedBy {
				return fmt.Errorf("EndpointSlice %s of %s is left", s.Name, s.Labels[discoveryv1.LabelManagedBy])
			}
			got = append(got, readyIPs([]discoveryv1.EndpointSlice{s})...)
		}
		if !sameIPs(got, apiIPs) {
			return fmt.Errorf("api endpoints %v, want %v", got, apiIPs)
		}
		return nil
	})
	harness.Eventually(t, 10*time.Second, "an AdoptedFromAWSController Event on the import", wantEvent(one, ns, "api", "AdoptedFromAWSController", corev1.EventTypeNormal, "imported-legacyapi"))
	// A few more polls of cluster-2 with the switch done.
	time.Sleep(2 * time.Second)
	close(sampling)
	<-done
	mu.Lock()
	if len(missing) > 0 || samples < 20 {
		t.Errorf("cluster-2 missed endpoints of web in %d of %d samples: %v", len(missing), samples, missing)
	} else {
		t.Logf("cluster-2 had every endpoint of web in all %d samples through the switch", samples)
	}
	mu.Unlock()

	// Step 4, the AWS controller gone: a ServiceExport deleted now is
	// withdrawn by clustermap, not held by the old finalizer.
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}}
	harness.Must(t, one.Delete(ctx, se))
	harness.Eventually(t, 60*time.Second, "the export deleted and withdrawn", func() error {
		if err := one.Get(ctx, client.ObjectKeyFromObject(se), se); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: finalizers %v (%v)", se.Finalizers, err)
		}
		if _, err := getImport(two, ns, "web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster-2 still imports web: %v", err)
		}
		return nil
	})
}

// startOne runs clustermap's controller for one cluster of the world.
func startOne(t *testing.T, w *world, i int) (stop func()) {
	return w.startControllersIn(t, w.env.Clusters[i:i+1], nil)
}

// replaceCRDs swaps a cluster's ServiceExport and ServiceImport CRDs for
// others (before any object of theirs exists).
func replaceCRDs(t *testing.T, cl client.Client, with []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	for _, u := range with {
		crd := &unstructured.Unstructured{}
		crd.SetAPIVersion("apiextensions.k8s.io/v1")
		crd.SetKind("CustomResourceDefinition")
		crd.SetName(u.GetName())
		harness.Must(t, client.IgnoreNotFound(cl.Delete(ctx, crd)))
		harness.Eventually(t, 30*time.Second, "CRD "+u.GetName()+" deleted", func() error {
			if err := cl.Get(ctx, client.ObjectKeyFromObject(crd), crd); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
	harness.Must(t, applyAll(ctx, cl, with))
	harness.Eventually(t, 30*time.Second, "the v1alpha1 CRDs served", func() error {
		for _, kind := range []string{"ServiceExportList", "ServiceImportList"} {
			l := &unstructured.UnstructuredList{}
			l.SetAPIVersion("multicluster.x-k8s.io/v1alpha1")
			l.SetKind(kind)
			if err := cl.List(ctx, l); err != nil {
				return err
			}
		}
		return nil
	})
}

// awsRecords writes an export's Cloud Map records as the AWS controller
// (0.3) writes them: its namespace and service, one instance per endpoint
// with its ids and attributes, no service record.
func awsRecords(t *testing.T, c *sd.Client, ns, name, cluster string, ips []string) {
	t.Helper()
	ctx := context.Background()
	svc, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String(name), NamespaceId: aws.String(cloudmaptest.Namespace(t, c, ns))})
	harness.Must(t, err)
	for _, ip := range ips {
		registerInstance(t, c, aws.ToString(svc.Service.Id), "tcp-"+strings.ReplaceAll(ip, ".", "_")+"-8080",
			map[string]string{
				"AWS_INSTANCE_IPV4": ip, "AWS_INSTANCE_PORT": "8080", "ENDPOINT_PORT_NAME": "http", "ENDPOINT_PROTOCOL": "TCP", "READY": "true",
				"CLUSTER_ID": cluster, "CLUSTERSET_ID": "clusterset-dev", "SERVICE_PORT_NAME": "http", "SERVICE_PORT": "80", "SERVICE_PROTOCOL": "TCP",
				"SERVICE_TARGET_PORT": "8080", "SERVICE_TYPE": "ClusterSetIP", "SERVICE_EXPORT_CREATION_TIMESTAMP": "1700000000000",
				"K8S_CONTROLLER": "aws-cloud-map-mcs-controller-for-k8s 0.3.1 (abc)",
			})
	}
}

// awsImport makes what the AWS controller makes for an import: a v1alpha1
// ServiceImport naming its derived Service, that Service (owned by the
// import) and an EndpointSlice of it.
func awsImport(t *testing.T, cl client.Client, ns, name, ip string) {
	t.Helper()
	ctx := context.Background()
	const derived = "imported-legacyapi"
	si := &unstructured.Unstructured{}
	si.SetAPIVersion("multicluster.x-k8s.io/v1alpha1")
	si.SetKind("ServiceImport")
	si.SetNamespace(ns)
	si.SetName(name)
	si.SetAnnotations(map[string]string{imports.AWSDerivedServiceAnnotation: derived})
	harness.Must(t, unstructured.SetNestedField(si.Object, "ClusterSetIP", "spec", "type"))
	harness.Must(t, unstructured.SetNestedSlice(si.Object, []any{map[string]any{"name": "http", "port": int64(80), "protocol": "TCP"}}, "spec", "ports"))
	harness.Must(t, cl.Create(ctx, si))
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: derived,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ServiceImport", Name: name, UID: si.GetUID(), Controller: ptr.To(true)}}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{httpPort(80, 8080)}}}
	harness.Must(t, cl.Create(ctx, svc))
	harness.Must(t, cl.Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: derived + "-abcde",
		Labels:          map[string]string{discoveryv1.LabelServiceName: derived, mcsv1beta1.LabelServiceName: name, discoveryv1.LabelManagedBy: imports.AWSManagedBy},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: derived, UID: svc.UID, Controller: ptr.To(true)}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}}}))
}

func containsAll(have, want []string) bool {
	for _, ip := range want {
		if !slices.Contains(have, ip) {
			return false
		}
	}
	return true
}

func sameIPs(a, b []string) bool {
	return len(a) == len(b) && containsAll(a, b)
}

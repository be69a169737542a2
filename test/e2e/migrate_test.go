//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
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

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
	"github.com/clustermap/clustermap/test/harness"
)

// legacy is a world where cluster-1 runs the AWS Cloud Map MCS controller
// and cluster-2 clustermap: cluster-1 has the AWS controller's CRDs
// (v1alpha1 only, as sigs.k8s.io/mcs-api v0.1.0 serves), a v1alpha1
// ServiceExport of web with that controller's finalizer, its Cloud Map
// records, and a ServiceImport of cluster-2's api that it made, with its
// derived Service and EndpointSlices; cluster-2 imports web from those
// records.
type legacy struct {
	w           *world
	one, two    client.Client
	ips, apiIPs []string // web's pods in cluster-1, api's in cluster-2
}

const legacyNS = "legacy"

func newLegacy(t *testing.T) *legacy {
	t.Helper()
	ctx := context.Background()
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	l := &legacy{w: w, one: w.clients[0], two: w.clients[1]}
	replaceCRDs(t, l.one, loadObjects(t, filepath.Join(devenv.BinDir(), "crds", "mcs-v1alpha1"), 2))
	w.allNamespaces(t, legacyNS)
	app(t, l.one, legacyNS, "web", 3, false, httpPort(80, 8080))
	l.ips = waitPods(t, l.one, legacyNS, "web", 3)
	legacyExport := &unstructured.Unstructured{}
	legacyExport.SetAPIVersion("multicluster.x-k8s.io/v1alpha1")
	legacyExport.SetKind("ServiceExport")
	legacyExport.SetNamespace(legacyNS)
	legacyExport.SetName("web")
	legacyExport.SetFinalizers([]string{export.AWSFinalizer})
	harness.Must(t, l.one.Create(ctx, legacyExport))
	awsRecords(t, w.cloudMap(t), legacyNS, "web", "cluster-1", l.ips)

	t.Cleanup(startOne(t, w, 1))
	app(t, l.two, legacyNS, "api", 2, false, httpPort(80, 8080))
	exportService(t, l.two, legacyNS, "api")
	l.apiIPs = waitPods(t, l.two, legacyNS, "api", 2)
	awsImport(t, l.one, legacyNS, "api", "10.99.0.1")
	harness.Eventually(t, importDeadline, "cluster-2 imports web from the AWS controller's records", func() error {
		s, err := importSlices(l.two, legacyNS, "web")
		if err == nil && !sameIPs(readyIPs(s), l.ips) {
			err = fmt.Errorf("ready %v, want %v", readyIPs(s), l.ips)
		}
		return err
	})
	return l
}

// keepsWeb samples cluster-2's import of web every 100 ms until the
// returned func is called, which fails the test if a sample missed one of
// web's endpoints.
func (l *legacy) keepsWeb(t *testing.T) (done func()) {
	return keepsImport(t, l.two, legacyNS, "web", l.ips)
}

// keepsImport samples a cluster's import every 100 ms until the returned
// func is called, which fails the test if a sample missed one of ips.
func keepsImport(t *testing.T, cl client.Client, ns, name string, ips []string) (done func()) {
	var mu sync.Mutex
	samples, missing := 0, []string{}
	sampling, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-sampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
			s, err := importSlices(cl, ns, name)
			mu.Lock()
			samples++
			if err != nil || !containsAll(readyIPs(s), ips) {
				missing = append(missing, fmt.Sprintf("%s: %v (%v)", time.Now().Format("15:04:05.000"), readyIPs(s), err))
			}
			mu.Unlock()
		}
	}()
	return func() {
		t.Helper()
		close(sampling)
		<-stopped
		mu.Lock()
		defer mu.Unlock()
		if len(missing) > 0 || samples < 20 {
			t.Errorf("the import of %s/%s missed endpoints in %d of %d samples: %v", ns, name, len(missing), samples, missing)
		} else {
			t.Logf("the import of %s/%s had every endpoint in all %d samples", ns, name, samples)
		}
	}
}

// toClustermap takes docs/migrate-from-aws-controller.md's steps 1 to 3 in
// cluster-1: the CRDs serve v1beta1 too, the AWS controller is scaled to 0
// (nothing to stop here), clustermap runs and takes the export over. It
// returns a client that knows v1beta1, and how to stop clustermap.
func (l *legacy) toClustermap(t *testing.T) (one client.Client, stop func()) {
	t.Helper()
	ctx := context.Background()
	harness.Must(t, applyAll(ctx, l.one, crds(t, loadChart(t))))
	// A new client: the old one's discovery knew v1alpha1 only.
	one = harness.Client(t, l.w.env.Clusters[0].Config)
	harness.Eventually(t, 30*time.Second, "the v1alpha1 ServiceExport read as v1beta1", func() error {
		se := &mcsv1beta1.ServiceExport{}
		if err := one.Get(ctx, client.ObjectKey{Namespace: legacyNS, Name: "web"}, se); err != nil {
			return err
		}
		if !slices.Contains(se.Finalizers, export.AWSFinalizer) {
			return fmt.Errorf("finalizers %v", se.Finalizers)
		}
		return nil
	})
	stop = startOne(t, l.w, 0)
	harness.Eventually(t, importDeadline, "cluster-1's export taken over", func() error {
		se := &mcsv1beta1.ServiceExport{}
		if err := one.Get(ctx, client.ObjectKey{Namespace: legacyNS, Name: "web"}, se); err != nil {
			return err
		}
		if c := condition(one, legacyNS, "web", "Ready"); c != "True/Exported" || slices.Contains(se.Finalizers, export.AWSFinalizer) || !slices.Contains(se.Finalizers, export.Finalizer) {
			return fmt.Errorf("Ready %s, finalizers %v", c, se.Finalizers)
		}
		return nil
	})
	return one, stop
}

// cluster1Records are cluster-1's records of web in Cloud Map, and the
// controllers that wrote them.
func (l *legacy) cluster1Records(t *testing.T) (records []recordfmt.Instance, controllers []string, err error) {
	out, err := l.w.cloudMap(t).DiscoverInstances(context.Background(), &sd.DiscoverInstancesInput{NamespaceName: aws.String(legacyNS), ServiceName: aws.String("web"),
		QueryParameters: map[string]string{recordfmt.AttrClusterID: "cluster-1"}})
	if err != nil {
		return nil, nil, err
	}
	for _, in := range out.Instances {
		records = append(records, recordfmt.Instance{ID: aws.ToString(in.InstanceId), Attrs: in.Attributes})
		if c := strings.Fields(in.Attributes[recordfmt.AttrController]); len(c) > 0 && !slices.Contains(controllers, c[0]) {
			controllers = append(controllers, c[0])
		}
	}
	slices.Sort(controllers)
	return records, controllers, nil
}

// TestMigrateFromAWSController switches cluster-1 of a legacy world from
// the AWS Cloud Map MCS controller to clustermap, following
// docs/migrate-from-aws-controller.md; cluster-2's import of web is
// sampled throughout and never misses an endpoint.
func TestMigrateFromAWSController(t *testing.T) {
	inParallel(t)
	ctx := context.Background()
	l := newLegacy(t)
	sampled := l.keepsWeb(t)
	one, stop1 := l.toClustermap(t)
	defer stop1()
	harness.Eventually(t, 10*time.Second, "an AdoptedFromAWSController Event on the export", wantEvent(one, legacyNS, "web", "AdoptedFromAWSController", corev1.EventTypeNormal, "finalizer removed"))
	// Adopted, not duplicated: the AWS controller's records of cluster-1
	// gave way to clustermap's (one per endpoint, and the service record).
	harness.Eventually(t, importDeadline, "one set of Cloud Map records for cluster-1", func() error {
		records, controllers, err := l.cluster1Records(t)
		if err != nil {
			return err
		}
		if !slices.Equal(controllers, []string{"clustermap"}) {
			return fmt.Errorf("records written by %v, want clustermap's only", controllers)
		}
		// clustermap's records, in whichever format: the endpoints once.
		exports := recordfmt.Decode(registry.Key{Namespace: legacyNS, Name: "web"}, records)
		if len(exports) != 1 || exports[0].Foreign || len(exports[0].Endpoints) != len(l.ips) {
			return fmt.Errorf("%d instances decode to %+v, want clustermap's export of %d endpoints", len(records), exports, len(l.ips))
		}
		return nil
	})
	// cluster-1's import of api: clustermap's, the AWS leftovers gone.
	harness.Eventually(t, importDeadline, "cluster-1's import of api taken over", func() error {
		si, err := getImport(one, legacyNS, "api")
		if err != nil {
			return err
		}
		if si.Labels[imports.LabelManagedBy] != "clustermap" || si.Annotations[imports.AWSDerivedServiceAnnotation] != "" {
			return fmt.Errorf("labels %v, annotations %v", si.Labels, si.Annotations)
		}
		if err := one.Get(ctx, client.ObjectKey{Namespace: legacyNS, Name: "imported-legacyapi"}, &corev1.Service{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the AWS derived Service: %v", err)
		}
		all := &discoveryv1.EndpointSliceList{}
		if err := one.List(ctx, all, client.InNamespace(legacyNS), client.MatchingLabels{mcsv1beta1.LabelServiceName: "api"}); err != nil {
			return err
		}
		var got []string
		for _, s := range all.Items {
			if s.Labels[discoveryv1.LabelManagedBy] != imports.ManagedBy {
				return fmt.Errorf("EndpointSlice %s of %s is left", s.Name, s.Labels[discoveryv1.LabelManagedBy])
			}
			got = append(got, readyIPs([]discoveryv1.EndpointSlice{s})...)
		}
		if !sameIPs(got, l.apiIPs) {
			return fmt.Errorf("api endpoints %v, want %v", got, l.apiIPs)
		}
		return nil
	})
	harness.Eventually(t, 10*time.Second, "an AdoptedFromAWSController Event on the import", wantEvent(one, legacyNS, "api", "AdoptedFromAWSController", corev1.EventTypeNormal, "imported-legacyapi"))
	// A few more polls of cluster-2 with the switch done.
	time.Sleep(2 * time.Second)
	sampled()

	// Step 4, the AWS controller gone: a ServiceExport deleted now is
	// withdrawn by clustermap, not held by the old finalizer.
	se := &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: legacyNS, Name: "web"}}
	harness.Must(t, one.Delete(ctx, se))
	harness.Eventually(t, 60*time.Second, "the export deleted and withdrawn", func() error {
		if err := one.Get(ctx, client.ObjectKeyFromObject(se), se); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: finalizers %v (%v)", se.Finalizers, err)
		}
		if _, err := getImport(l.two, legacyNS, "web"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster-2 still imports web: %v", err)
		}
		return nil
	})
}

// TestMigrationWayBack switches cluster-1 of a legacy world to clustermap,
// then back to the AWS controller as docs/migrate-from-aws-controller.md
// says ("If you go back"), its commands as written: the ServiceExport
// stays with the AWS controller's finalizer, clustermap's imports and
// records of cluster-1 go, its proof of life too (else the others would
// drain cluster-1 once it is silent past the TTL), the AWS controller's
// records stay, and cluster-2 never misses an endpoint of web.
func TestMigrationWayBack(t *testing.T) {
	inParallel(t)
	ctx := context.Background()
	l := newLegacy(t)
	sampled := l.keepsWeb(t)
	one, stop := l.toClustermap(t)
	stop1 := sync.OnceFunc(stop)
	defer stop1()
	harness.Eventually(t, importDeadline, "clustermap's records of cluster-1, and its import of api", func() error {
		if _, controllers, err := l.cluster1Records(t); err != nil || !slices.Equal(controllers, []string{"clustermap"}) {
			return fmt.Errorf("records written by %v (%v)", controllers, err)
		}
		si, err := getImport(one, legacyNS, "api")
		if err == nil && si.Labels[imports.LabelManagedBy] != "clustermap" {
			err = fmt.Errorf("labels %v", si.Labels)
		}
		return err
	})

	doc, err := os.ReadFile("../../docs/migrate-from-aws-controller.md")
	harness.Must(t, err)
	back := string(doc)[strings.Index(string(doc), "## If you go back"):]
	for _, step := range []string{
		"Scale clustermap's controller to 0 and the AWS controller back to 1.",
		"helm uninstall clustermap -n clustermap-system --no-hooks",
		"clustermap uninstall --context <this cluster> --phase cleanup --force",
		"clustermap forget-cluster <cluster id> --clusterset <clusterset id> --region <region> --force --only-clustermap",
	} {
		if !strings.Contains(back, step) {
			t.Fatalf("docs/migrate-from-aws-controller.md's way back no longer says %q: bring this test to it", step)
		}
	}
	// clustermap scaled to 0 (its release uninstalled without hooks: no
	// controller runs); the AWS controller back: it re-adds its finalizer
	// and registers its records again, beside clustermap's.
	stop1()
	se := &mcsv1beta1.ServiceExport{}
	harness.Must(t, one.Get(ctx, client.ObjectKey{Namespace: legacyNS, Name: "web"}, se))
	base := se.DeepCopy()
	se.Finalizers = append(se.Finalizers, export.AWSFinalizer)
	harness.Must(t, one.Patch(ctx, se, client.MergeFrom(base)))
	c := l.w.cloudMap(t)
	awsInstances(t, c, l.w.serviceID(t, c, legacyNS, "web"), "cluster-1", l.ips)
	t.Log(runCLI(t, "uninstall", "--kubeconfig", l.w.env.Kubeconfig, "--context", "cluster-1", "--phase", "cleanup", "--force"))
	t.Log(runCLI(t, "forget-cluster", "cluster-1", "--clusterset", devenv.DefaultClusterSet,
		"--region", "us-east-1", "--cloudmap-endpoint", l.w.cm.URL, "--force", "--only-clustermap"))

	harness.Must(t, one.Get(ctx, client.ObjectKeyFromObject(se), se))
	if !slices.Equal(se.Finalizers, []string{export.AWSFinalizer}) {
		t.Errorf("the ServiceExport's finalizers: %v, want the AWS controller's only", se.Finalizers)
	}
	sis := &mcsv1beta1.ServiceImportList{}
	harness.Must(t, one.List(ctx, sis))
	for _, si := range sis.Items {
		if si.Labels[imports.LabelManagedBy] == "clustermap" {
			t.Errorf("clustermap's ServiceImport %s/%s is left", si.Namespace, si.Name)
		}
	}
	harness.Eventually(t, importDeadline, "only the AWS controller's records of cluster-1 left, its proof of life gone", func() error {
		records, controllers, err := l.cluster1Records(t)
		if err != nil {
			return err
		}
		if !slices.Equal(controllers, []string{"aws-cloud-map-mcs-controller-for-k8s"}) || len(records) != len(l.ips) {
			return fmt.Errorf("%d records written by %v, want the AWS controller's %d", len(records), controllers, len(l.ips))
		}
		proofs, err := l.w.cloudMap(t).DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String(cloudmap.ChangesNamespace(devenv.DefaultClusterSet)),
			ServiceName: aws.String(cloudmap.ChangesService), QueryParameters: map[string]string{recordfmt.AttrClusterID: "cluster-1"}})
		if err == nil && len(proofs.Instances) > 0 {
			err = fmt.Errorf("cluster-1's proof of life is left")
		}
		if cloudmapclient.IsNotFound(err) {
			return nil // the record's service went with it
		}
		return err
	})
	// cluster-2 reads cluster-1's export from the AWS controller's records
	// alone now: a few more polls.
	time.Sleep(2 * cloudmap.DefaultReadLag)
	sampled()
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
	svc, err := c.CreateService(context.Background(), &sd.CreateServiceInput{Name: aws.String(name), NamespaceId: aws.String(cloudmaptest.Namespace(t, c, ns))})
	harness.Must(t, err)
	awsInstances(t, c, aws.ToString(svc.Service.Id), cluster, ips)
}

// awsInstances registers an export's instances as the AWS controller does.
func awsInstances(t *testing.T, c *sd.Client, serviceID, cluster string, ips []string) {
	t.Helper()
	for _, ip := range ips {
		registerInstance(t, c, serviceID, "tcp-"+strings.ReplaceAll(ip, ".", "_")+"-8080",
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

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/test/harness"
)

func (w *world) allNamespaces(t *testing.T, ns string) {
	for _, cl := range w.clients {
		namespace(t, cl, ns)
	}
}

// importedEverywhere waits until every cluster imports the service with
// these ready endpoints (sorted IPs) from these clusters.
func (w *world) importedEverywhere(t *testing.T, within time.Duration, ns, name, clusters string, ips []string) {
	t.Helper()
	for i, cl := range w.clients {
		harness.Eventually(t, within, fmt.Sprintf("%s/%s in %s", ns, name, w.env.Clusters[i].ID), func() error {
			si, err := getImport(cl, ns, name)
			if err != nil {
				return err
			}
			if clustersOf(si) != clusters {
				return fmt.Errorf("status.clusters %q, want %q", clustersOf(si), clusters)
			}
			if si.Status.EndpointSliceObjects != mcsv1beta1.EndpointSliceObjectsPresent {
				return fmt.Errorf("status.endpointSliceObjects %q, want Present (KEP-1645)", si.Status.EndpointSliceObjects)
			}
			slices, err := importSlices(cl, ns, name)
			if err != nil {
				return err
			}
			if got := readyIPs(slices); !reflect.DeepEqual(got, ips) && !(len(got) == 0 && len(ips) == 0) {
				return fmt.Errorf("endpoints %v, want %v (import: families %v, slices %s; %s)", got, ips, si.Spec.IPFamilies, sliceTypes(slices), w.exportState(ns, name, clusters))
			}
			return nil
		})
	}
}

// exportState says what the exporting clusters hold and published of a
// Service (its families, its EndpointSlices, its export's Ready message),
// so that an import found short tells whose side it is on.
func (w *world) exportState(ns, name, clusters string) string {
	var out []string
	for i, c := range w.env.Clusters {
		if !slices.Contains(strings.Split(clusters, ","), c.ID) {
			continue
		}
		cl := w.clients[i]
		svc := &corev1.Service{}
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", c.ID, err))
			continue
		}
		list := &discoveryv1.EndpointSliceList{}
		if err := cl.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", c.ID, err))
			continue
		}
		var own []discoveryv1.EndpointSlice
		for _, s := range list.Items {
			if s.Labels[discoveryv1.LabelManagedBy] != imports.ManagedBy {
				own = append(own, s)
			}
		}
		se := &mcsv1beta1.ServiceExport{}
		ready := "no ServiceExport"
		if cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se) == nil {
			if cond := meta.FindStatusCondition(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionReady)); cond != nil {
				ready = fmt.Sprintf("Ready %s/%s %q", cond.Status, cond.Reason, cond.Message)
			}
		}
		out = append(out, fmt.Sprintf("in %s: Service families %v, slices %s, %s", c.ID, svc.Spec.IPFamilies, sliceTypes(own), ready))
	}
	return "source " + strings.Join(out, "; ")
}

// sliceTypes is each slice's address type and addresses.
func sliceTypes(list []discoveryv1.EndpointSlice) string {
	var out []string
	for _, s := range list {
		var addrs []string
		for _, e := range s.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
		out = append(out, fmt.Sprintf("%s%v", s.AddressType, addrs))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// exportApp deploys an app in cluster-1, exports it, and waits until every
// cluster imports its pods; it returns their addresses.
func (w *world) exportApp(t *testing.T, ns, name string, replicas int32) []string {
	t.Helper()
	app(t, w.clients[0], ns, name, replicas, false, httpPort(80, 8080))
	exportService(t, w.clients[0], ns, name)
	ips := waitPods(t, w.clients[0], ns, name, int(replicas))
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)
	return ips
}

func waitPods(t *testing.T, cl client.Client, ns, name string, n int) []string {
	t.Helper()
	var ips []string
	// kwok readies pods at its own pace, not clustermap's: 180 of them
	// took over 30 s on a loaded machine (TestThreeLargeExportsFit).
	harness.Eventually(t, 2*time.Minute, fmt.Sprintf("%d ready pods of %s/%s", n, ns, name), func() error {
		var err error
		if ips, err = readyPodIPs(cl, ns, name); err == nil && len(ips) != n {
			err = fmt.Errorf("%d ready", len(ips))
		}
		return err
	})
	return ips
}

func (w *world) headless(t *testing.T) {
	const ns, name = "headless", "db"
	w.allNamespaces(t, ns)
	src := w.clients[0]
	labels := map[string]string{"app": name}
	harness.Must(t, src.Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels, Ports: []corev1.ServicePort{httpPort(5432, 5432)}}}))
	harness.Must(t, src.Create(context.Background(), &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), ServiceName: name, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "db"}}}}}}))
	exportService(t, src, ns, name)
	ips := waitPods(t, src, ns, name, 2)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)
	for i, cl := range w.clients {
		si, _ := getImport(cl, ns, name)
		if si.Spec.Type != mcsv1beta1.Headless || len(si.Spec.IPs) != 0 {
			t.Errorf("%s: headless import %+v", w.env.Clusters[i].ID, si.Spec)
		}
		derived := &corev1.Service{}
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: imports.DerivedName(name)}, derived); !apierrors.IsNotFound(err) {
			t.Errorf("%s: a headless import needs no derived Service: %v", w.env.Clusters[i].ID, err)
		}
		slices, _ := importSlices(cl, ns, name)
		var hosts []string
		for _, s := range slices {
			for _, e := range s.Endpoints {
				if e.Hostname != nil {
					hosts = append(hosts, *e.Hostname)
				}
			}
		}
		sort.Strings(hosts)
		if strings.Join(hosts, ",") != "db-0,db-1" {
			t.Errorf("%s: hostnames %v, want db-0,db-1", w.env.Clusters[i].ID, hosts)
		}
	}
}

func (w *world) scaling(t *testing.T) {
	const ns, name = "scaling", "api"
	w.allNamespaces(t, ns)
	src := w.clients[0]
	app(t, src, ns, name, 3, false, httpPort(80, 8080))
	exportService(t, src, ns, name)
	for _, n := range []int32{3, 10, 0, 3} {
		harness.Scale(t, src, ns, name, n)
		ips := waitPods(t, src, ns, name, int(n))
		w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)
	}
}

func (w *world) twoExporters(t *testing.T) {
	const ns, name = "merged", "cache"
	w.allNamespaces(t, ns)
	var all []string
	for _, cl := range w.clients[:2] {
		app(t, cl, ns, name, 2, false, httpPort(6379, 6379))
		exportService(t, cl, ns, name)
		all = append(all, waitPods(t, cl, ns, name, 2)...)
	}
	sort.Strings(all)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1,cluster-2", all)
	// Each source cluster's slices say where they come from.
	slices, _ := importSlices(w.clients[2], ns, name)
	from := map[string]int{}
	for _, s := range slices {
		from[s.Labels[mcsv1beta1.LabelSourceCluster]] += len(s.Endpoints)
	}
	if from["cluster-1"] != 2 || from["cluster-2"] != 2 {
		t.Errorf("endpoints by source cluster: %v", from)
	}
}

func (w *world) conflicts(t *testing.T) {
	const ns = "conflicts"
	w.allNamespaces(t, ns)
	c1, c2 := w.clients[0], w.clients[1]
	// Port conflict: the same port name with another number; cluster-1 exports first.
	exportInTurn(t, ns, "ports", "True/PortConflict",
		func() { app(t, c1, ns, "ports", 1, false, httpPort(80, 8080)) }, c1,
		func() { app(t, c2, ns, "ports", 1, false, httpPort(81, 8080)) }, c2)
	for i, cl := range w.clients {
		harness.Eventually(t, importDeadline, "the oldest port in "+w.env.Clusters[i].ID, func() error {
			si, err := getImport(cl, ns, "ports")
			if err != nil {
				return err
			}
			if len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 || clustersOf(si) != "cluster-1,cluster-2" {
				return fmt.Errorf("ports %+v clusters %s", si.Spec.Ports, clustersOf(si))
			}
			return nil
		})
	}

	// Type conflict: cluster-2's headless export is the older one.
	exportInTurn(t, ns, "kind", "True/TypeConflict",
		func() { app(t, c2, ns, "kind", 1, true, httpPort(80, 8080)) }, c2,
		func() { app(t, c1, ns, "kind", 1, false, httpPort(80, 8080)) }, c1)
	for i, cl := range w.clients {
		harness.Eventually(t, importDeadline, "the oldest type in "+w.env.Clusters[i].ID, func() error {
			si, err := getImport(cl, ns, "kind")
			if err != nil {
				return err
			}
			if si.Spec.Type != mcsv1beta1.Headless || len(si.Spec.IPs) != 0 {
				return fmt.Errorf("type %s ips %v", si.Spec.Type, si.Spec.IPs)
			}
			return nil
		})
	}
}

// differingSets: port sets that differ without clashing are unioned with
// PortConflict on both exports; exported labels and annotations come whole
// from the oldest export, with the conflict on both; agreeing again clears it.
func (w *world) differingSets(t *testing.T) {
	const ns = "conflicts-sets"
	w.allNamespaces(t, ns)
	c1, c2 := w.clients[0], w.clients[1]
	// SCTP, as the upstream conformance suite's union of ports has it.
	metrics := corev1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolSCTP, Port: 9090, TargetPort: intstr.FromInt32(9090)}
	exportInTurn(t, ns, "ports", "True/PortConflict",
		func() { app(t, c1, ns, "ports", 1, false, httpPort(80, 8080)) }, c1,
		func() { app(t, c2, ns, "ports", 1, false, httpPort(80, 8080), metrics) }, c2)
	w.eachImport(t, ns, "ports", "the union of the ports", func(si *mcsv1beta1.ServiceImport) error {
		if len(si.Spec.Ports) != 2 || si.Spec.Ports[0].Port != 80 || si.Spec.Ports[1].Port != 9090 || si.Spec.Ports[1].Protocol != corev1.ProtocolSCTP {
			return fmt.Errorf("ports %+v", si.Spec.Ports)
		}
		return nil
	})
	updateService(t, c2, ns, "ports", func(s *corev1.Service) { s.Spec.Ports = s.Spec.Ports[:1] })
	for _, cl := range []client.Client{c1, c2} {
		harness.Eventually(t, importDeadline, "the port conflict cleared", wantCondition(cl, ns, "ports", "Conflict", "False/NoConflicts"))
	}

	setExported := func(cl client.Client, labels, annotations map[string]string) {
		harness.Must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			se := &mcsv1beta1.ServiceExport{}
			if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "labels"}, se); err != nil {
				return err
			}
			se.Spec.ExportedLabels, se.Spec.ExportedAnnotations = labels, annotations
			return cl.Update(context.Background(), se)
		}))
	}
	exportInTurn(t, ns, "labels", "False/NoConflicts",
		func() { app(t, c1, ns, "labels", 1, false, httpPort(80, 8080)) }, c1,
		func() { app(t, c2, ns, "labels", 1, false, httpPort(80, 8080)) }, c2)
	setExported(c1, map[string]string{"team": "a"}, map[string]string{"note": "old"})
	setExported(c2, map[string]string{"team": "b", "extra": "1"}, map[string]string{"note": "old", "more": "x"})
	for _, cl := range []client.Client{c1, c2} {
		harness.Eventually(t, importDeadline, "the label conflict", wantCondition(cl, ns, "labels", "Conflict", "True/LabelsConflict,AnnotationsConflict"))
	}
	w.eachImport(t, ns, "labels", "the oldest export's labels and annotations only", func(si *mcsv1beta1.ServiceImport) error {
		if si.Labels["team"] != "a" || si.Labels["extra"] != "" || si.Annotations["note"] != "old" || si.Annotations["more"] != "" {
			return fmt.Errorf("labels %v annotations %v", si.Labels, si.Annotations)
		}
		return nil
	})
	setExported(c2, map[string]string{"team": "a"}, map[string]string{"note": "old"})
	for _, cl := range []client.Client{c1, c2} {
		harness.Eventually(t, importDeadline, "the label conflict cleared", wantCondition(cl, ns, "labels", "Conflict", "False/NoConflicts"))
	}
}

// eachImport waits until every cluster's import passes check.
func (w *world) eachImport(t *testing.T, ns, name, what string, check func(*mcsv1beta1.ServiceImport) error) {
	t.Helper()
	for i, cl := range w.clients {
		harness.Eventually(t, importDeadline, what+" in "+w.env.Clusters[i].ID, func() error {
			si, err := getImport(cl, ns, name)
			if err != nil {
				return err
			}
			return check(si)
		})
	}
}

// exportInTurn exports a service from the older cluster, then, a second
// later (creation times have second precision), from the younger one, and
// waits for the conflict condition on both exports.
func exportInTurn(t *testing.T, ns, name, conflict string, mkOlder func(), older client.Client, mkYounger func(), younger client.Client) {
	t.Helper()
	mkOlder()
	exportService(t, older, ns, name)
	harness.Eventually(t, importDeadline, "the first export", wantCondition(older, ns, name, "Ready", "True/Exported"))
	time.Sleep(1100 * time.Millisecond)
	mkYounger()
	exportService(t, younger, ns, name)
	for _, cl := range []client.Client{older, younger} {
		harness.Eventually(t, importDeadline, conflict+" on both exports", wantCondition(cl, ns, name, "Conflict", conflict))
	}
}

func (w *world) cloudMap(t *testing.T) *sd.Client {
	return cloudmaptest.ClientOf(t, w.cm.URL, cloudmapclient.Options{})
}

func (w *world) unexport(t *testing.T) {
	const ns, name = "unexport", "gone"
	w.allNamespaces(t, ns)
	src := w.clients[0]
	w.exportApp(t, ns, name, 2)

	start := time.Now()
	harness.Must(t, src.Delete(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
	for i, cl := range w.clients {
		harness.Eventually(t, importDeadline-time.Since(start), "the import gone from "+w.env.Clusters[i].ID, func() error {
			if _, err := getImport(cl, ns, name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("ServiceImport still there: %v", err)
			}
			if slices, err := importSlices(cl, ns, name); err != nil || len(slices) > 0 {
				return fmt.Errorf("%d EndpointSlices left (%v)", len(slices), err)
			}
			derived := &corev1.Service{}
			if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: imports.DerivedName(name)}, derived); !apierrors.IsNotFound(err) {
				return fmt.Errorf("derived Service still there: %v", err)
			}
			return nil
		})
	}
	t.Logf("imports removed from 3 clusters %v after unexport", time.Since(start).Round(time.Millisecond))
	if w.hub != nil {
		w.hubClean(t, ns, name)
	} else {
		w.cloudMapClean(t, ns)
	}
	se := &mcsv1beta1.ServiceExport{}
	if err := src.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se); !apierrors.IsNotFound(err) {
		t.Errorf("the ServiceExport should be gone once withdrawn: %v", err)
	}
}

// cloudMapClean waits until Cloud Map holds nothing of a namespace.
func (w *world) cloudMapClean(t *testing.T, ns string) {
	t.Helper()
	c := w.cloudMap(t)
	harness.Eventually(t, importDeadline, "Cloud Map cleaned", func() error {
		out, err := c.ListNamespaces(context.Background(), &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{{Name: types.NamespaceFilterNameName, Values: []string{ns}}}})
		if err != nil {
			return err
		}
		if len(out.Namespaces) != 0 {
			return fmt.Errorf("namespace %s still in Cloud Map (%d services)", ns, aws.ToInt32(out.Namespaces[0].ServiceCount))
		}
		return nil
	})
}

func (w *world) invalid(t *testing.T) {
	const ns = "invalid"
	w.allNamespaces(t, ns)
	src := w.clients[0]
	harness.Must(t, src.Create(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}}))
	exportService(t, src, ns, "ext")
	exportService(t, src, ns, "missing")
	harness.Eventually(t, importDeadline, "ExternalName rejected", wantCondition(src, ns, "ext", "Valid", "False/InvalidServiceType"))
	harness.Eventually(t, importDeadline, "missing Service rejected", wantCondition(src, ns, "missing", "Valid", "False/NoService"))
	harness.Eventually(t, importDeadline, "Ready False", wantCondition(src, ns, "missing", "Ready", "False/Failed"))
	harness.Eventually(t, 5*time.Second, "a Warning Event", wantEvent(src, ns, "missing", "NoService", corev1.EventTypeWarning, "does not exist"))
	// Creating the Service makes the export valid.
	app(t, src, ns, "missing", 1, false, httpPort(80, 8080))
	harness.Eventually(t, importDeadline, "valid once the Service exists", wantCondition(src, ns, "missing", "Valid", "True/Valid"))
	w.importedEverywhere(t, importDeadline, ns, "missing", "cluster-1", waitPods(t, src, ns, "missing", 1))
	for _, cl := range w.clients {
		if _, err := getImport(cl, ns, "ext"); !apierrors.IsNotFound(err) {
			t.Errorf("an ExternalName export must not be imported: %v", err)
		}
	}
}

func (w *world) lateNamespace(t *testing.T) {
	const ns, name = "late", "svc"
	namespace(t, w.clients[0], ns)
	namespace(t, w.clients[1], ns)
	app(t, w.clients[0], ns, name, 1, false, httpPort(80, 8080))
	exportService(t, w.clients[0], ns, name)
	ips := waitPods(t, w.clients[0], ns, name, 1)
	harness.Eventually(t, importDeadline, "imported where the namespace exists", func() error {
		_, err := getImport(w.clients[1], ns, name)
		return err
	})
	third := w.clients[2]
	if err := third.Get(context.Background(), client.ObjectKey{Name: ns}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
		t.Fatalf("cluster-3 must not have the namespace: %v", err)
	}
	namespace(t, third, ns)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)
}

// Instances of another clusterset under the same Cloud Map service are
// neither imported nor deleted.
func (w *world) otherClusterSet(t *testing.T) {
	const ns, name = "isolated", "shared"
	w.allNamespaces(t, ns)
	src := w.clients[0]
	w.exportApp(t, ns, name, 1)
	c := w.cloudMap(t)
	svcID := w.serviceID(t, c, ns, name)
	registerInstance(t, c, svcID, "other-set-endpoint", map[string]string{"AWS_INSTANCE_IPV4": "10.250.0.1", "AWS_INSTANCE_PORT": "8080", "CLUSTER_ID": "cluster-1", "CLUSTERSET_ID": "another-set",
		"SERVICE_PORT": "80", "SERVICE_TYPE": "ClusterSetIP", "SERVICE_EXPORT_CREATION_TIMESTAMP": "1"})
	harness.Scale(t, src, ns, name, 2) // a change to import
	ips := waitPods(t, src, ns, name, 2)
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)

	harness.Must(t, src.Delete(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}))
	harness.Eventually(t, importDeadline, "import removed", func() error {
		if _, err := getImport(w.clients[1], ns, name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still imported: %v", err)
		}
		return nil
	})
	out, err := c.GetInstance(context.Background(), &sd.GetInstanceInput{ServiceId: aws.String(svcID), InstanceId: aws.String("other-set-endpoint")})
	if err != nil || out.Instance.Attributes["CLUSTERSET_ID"] != "another-set" {
		t.Errorf("the other clusterset's instance must survive our unexport: %v", err)
	}
}

func (w *world) serviceID(t *testing.T, c *sd.Client, ns, name string) string {
	t.Helper()
	nss, err := c.ListNamespaces(context.Background(), &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{{Name: types.NamespaceFilterNameName, Values: []string{ns}}}})
	if err != nil || len(nss.Namespaces) != 1 {
		t.Fatalf("Cloud Map namespace %s: %v %v", ns, err, nss)
	}
	svcs, err := c.ListServices(context.Background(), &sd.ListServicesInput{Filters: []types.ServiceFilter{{Name: types.ServiceFilterNameNamespaceId, Values: []string{aws.ToString(nss.Namespaces[0].Id)}}}})
	harness.Must(t, err)
	for _, s := range svcs.Services {
		if aws.ToString(s.Name) == name {
			return aws.ToString(s.Id)
		}
	}
	t.Fatalf("no Cloud Map service %s/%s", ns, name)
	return ""
}

// A cluster running the AWS Cloud Map MCS controller writes its endpoints
// with that controller's attributes; clustermap imports them.
func (w *world) awsSchema(t *testing.T) {
	const ns, name = "aws-schema", "legacy"
	w.allNamespaces(t, ns)
	awsRecords(t, w.cloudMap(t), ns, name, "eks-legacy", []string{"10.77.0.1", "10.77.0.2"})
	w.importedEverywhere(t, importDeadline, ns, name, "eks-legacy", []string{"10.77.0.1", "10.77.0.2"})
	si, _ := getImport(w.clients[1], ns, name)
	if si.Spec.Type != mcsv1beta1.ClusterSetIP || len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 || len(si.Spec.IPs) != 1 {
		t.Errorf("import of the AWS controller's export: %+v", si.Spec)
	}
	slices, _ := importSlices(w.clients[1], ns, name)
	if len(slices) != 1 || *slices[0].Ports[0].Port != 8080 || slices[0].AddressType != discoveryv1.AddressTypeIPv4 {
		t.Errorf("slices: %+v", slices)
	}
}

// A write Cloud Map accepts and then fails says so on the export (Ready
// False/Pending, a CloudMapWriteFailed Event), is written again, and the
// export is imported once the writes succeed.
func (w *world) lateFailure(t *testing.T) {
	const ns, name = "late-fail", "web"
	w.allNamespaces(t, ns)
	w.exportApp(t, ns, "first", 1) // the namespace, written before the fault
	src := w.clients[0]
	app(t, src, ns, name, 1, false, httpPort(80, 8080))
	ips := waitPods(t, src, ns, name, 1)
	w.cm.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	lifted := false
	defer func() {
		if !lifted {
			w.cm.SetFaults(cloudmaplocal.Faults{})
		}
	}()
	exportService(t, src, ns, name)
	harness.Eventually(t, time.Minute, "a Pending Ready condition naming the failed operation", func() error {
		se := &mcsv1beta1.ServiceExport{}
		if err := src.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se); err != nil {
			return err
		}
		for _, c := range se.Status.Conditions {
			if c.Type == "Ready" && c.Status == metav1.ConditionFalse && c.Reason == "Pending" && strings.Contains(c.Message, "then failed it") {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", se.Status.Conditions)
	})
	harness.Eventually(t, 5*time.Second, "a CloudMapWriteFailed Event", wantEvent(src, ns, name, "CloudMapWriteFailed", corev1.EventTypeWarning, "then failed it"))
	w.cm.SetFaults(cloudmaplocal.Faults{})
	lifted = true
	harness.Eventually(t, time.Minute, "Ready again", wantCondition(src, ns, name, "Ready", "True/Exported"))
	w.importedEverywhere(t, importDeadline, ns, name, "cluster-1", ips)
}

// An export Cloud Map cannot hold becomes a condition and an Event, not a
// silent cut-off.
func (w *world) tooLarge(t *testing.T) {
	const ns, name = "too-large", "big"
	w.allNamespaces(t, ns)
	src := w.clients[0]
	app(t, src, ns, name, 1, false, httpPort(80, 8080))
	harness.Must(t, src.Create(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: mcsv1beta1.ServiceExportSpec{ExportedAnnotations: map[string]string{"notes": strings.Repeat("x", 1100)}}}))
	harness.Eventually(t, importDeadline, "a Failed Ready condition", wantCondition(src, ns, name, "Ready", "False/Failed"))
	se := &mcsv1beta1.ServiceExport{}
	harness.Must(t, src.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se))
	for _, c := range se.Status.Conditions {
		if c.Type == "Ready" && !strings.Contains(c.Message, "1024") {
			t.Errorf("the condition should name the limit: %s", c.Message)
		}
	}
	harness.Eventually(t, 5*time.Second, "a CloudMapQuota Event", func() error {
		evs := &corev1.EventList{}
		if err := src.List(context.Background(), evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "CloudMapQuota" && e.InvolvedObject.Name == name {
				return nil
			}
		}
		return fmt.Errorf("no CloudMapQuota Event")
	})
}

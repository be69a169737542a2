//go:build e2e

// Package e2e runs clustermap on local clusters against the Cloud Map
// emulator and checks what each cluster ends up holding.
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
	"github.com/clustermap/clustermap/test/harness"
)

// inParallel marks a test that may run beside others (go test's -parallel,
// set in the Makefile), after the sequential ones: it holds its own
// clusters and emulator, binds no fixed port, and asserts nothing a
// loaded machine changes. Most wait far more than they compute (an
// outage held, a grace period, Helm and kubectl round trips), and the
// suite is bound by waits, not by the 2 cores. A stopped cluster keeps
// its ports (devenv.StopCluster), so clusters made beside it cannot take
// them. Left sequential: the tests that time the data plane or load it
// (Dataplane, ReadmeLabBlocks on fixed ports, ThreeLargeExportsFit) and
// the leader's lease.
func inParallel(t *testing.T) { t.Parallel() }

// world is N clusters, the emulator, and a controller in each cluster.
type world struct {
	env     *devenv.Env
	cm      *devenv.CloudMap
	clients []client.Client
	// calls counts the controllers' Cloud Map calls by operation.
	calls cloudmapclient.Calls
	// log holds the controllers' lines until the test fails
	// (harness.HeldLog), made by the first startControllers.
	log logr.Logger
	// hub, when set, is the hub cluster that is the registry in place of
	// Cloud Map (cm is nil then), and hubKubeconfigs each member's file
	// from clustermap hub join, by cluster id.
	hub            *devenv.Cluster
	hubKubeconfigs map[string]string
}

// worldOptions say what a world holds: its member clusters (Clusters is
// how many), its registry (the emulator with CloudMap's options, or a hub
// cluster initialised for the clusterset with every member joined), and
// whether a controller starts in every cluster at once, in MCS mode at the
// suite's settings (startControllers), stopped at the test's end.
type worldOptions struct {
	devenv.Options
	CloudMap    cloudmaplocal.Options
	Hub         bool
	Controllers bool
}

// newWorld makes a world as o says.
func newWorld(t *testing.T, o worldOptions) *world {
	t.Helper()
	w := &world{env: harness.ClustersWith(t, o.Options)}
	if o.Hub {
		w.joinHub(t)
	} else {
		w.cm = harness.CloudMap(t, o.CloudMap)
	}
	w.connect(t)
	if o.Controllers {
		t.Cleanup(w.startControllers(t, nil))
	}
	return w
}

// connect makes a client per cluster.
func (w *world) connect(t *testing.T) {
	for _, c := range w.env.Clusters {
		cl := harness.Client(t, c.Config)
		w.clients = append(w.clients, cl)
	}
}

// startControllers runs a controller per cluster, in MCS mode unless tune
// says otherwise; the returned func stops them.
func (w *world) startControllers(t *testing.T, tune func(*controller.Options)) (stop func()) {
	return w.startControllersIn(t, w.env.Clusters, tune)
}

// startControllersIn is startControllers in some of the clusters only.
func (w *world) startControllersIn(t *testing.T, clusters []*devenv.Cluster, tune func(*controller.Options)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	some := *w.env
	some.Clusters = clusters
	if w.log.GetSink() == nil {
		w.log = harness.HeldLog(t)
	}
	cmURL := ""
	if w.cm != nil {
		cmURL = w.cm.URL
	}
	wait := some.StartControllers(ctx, cmURL,
		func(*devenv.Cluster) logr.Logger { return w.log },
		func(o *controller.Options) {
			// Polls every 500 ms rather than 1.5 s, to keep the suite
			// short; every other setting is the shipped default.
			o.Watch = cloudmap.WatchOptions{PollInterval: 500 * time.Millisecond}
			o.OnCloudMapCall = w.calls.Record
			for _, c := range clusters {
				if c.Config == o.Config && w.hub != nil {
					o.HubKubeconfig = w.hubKubeconfigs[c.ID]
				}
			}
			if tune != nil {
				tune(o)
			}
		})
	return func() {
		cancel()
		if err := wait(); err != nil {
			t.Errorf("controllers: %v", err)
		}
	}
}

func namespace(t *testing.T, cl client.Client, name string) {
	t.Helper()
	err := cl.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// app creates a Deployment and its Service.
func app(t *testing.T, cl client.Client, ns, name string, replicas int32, headless bool, ports ...corev1.ServicePort) {
	t.Helper()
	appWith(t, cl, ns, name, replicas, headless, nil, ports...)
}

// appWith is app with annotations on the pods.
func appWith(t *testing.T, cl client.Client, ns, name string, replicas int32, headless bool, podAnnotations map[string]string, ports ...corev1.ServicePort) {
	t.Helper()
	harness.CreateApp(t, cl, harness.App{Namespace: ns, Name: name, Replicas: replicas, Headless: headless, Ports: ports, PodAnnotations: podAnnotations})
}

func httpPort(port, target int32) corev1.ServicePort {
	return corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(target)}
}

func exportService(t *testing.T, cl client.Client, ns, name string) {
	t.Helper()
	harness.Must(t, cl.Create(context.Background(), &mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}))
}

// readyPodIPs lists the ready addresses the cluster's own EndpointSlice
// controller publishes for a Service.
func readyPodIPs(cl client.Client, ns, name string) ([]string, error) {
	list := &discoveryv1.EndpointSliceList{}
	if err := cl.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}); err != nil {
		return nil, err
	}
	// Distinct: kwok hands a deleted pod's address to its replacement, so
	// for a moment two endpoints can share one.
	return slices.Compact(readyIPs(list.Items)), nil
}

func readyIPs(slices []discoveryv1.EndpointSlice) []string {
	var ips []string
	for _, s := range slices {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				ips = append(ips, e.Addresses...)
			}
		}
	}
	sort.Strings(ips)
	return ips
}

// importSlices lists clustermap's EndpointSlices of an import.
func importSlices(cl client.Client, ns, name string) ([]discoveryv1.EndpointSlice, error) {
	slices := &discoveryv1.EndpointSliceList{}
	err := cl.List(context.Background(), slices, client.InNamespace(ns), client.MatchingLabels{mcsv1beta1.LabelServiceName: name, discoveryv1.LabelManagedBy: imports.ManagedBy})
	return slices.Items, err
}

func getImport(cl client.Client, ns, name string) (*mcsv1beta1.ServiceImport, error) {
	si := &mcsv1beta1.ServiceImport{}
	return si, cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, si)
}

func clustersOf(si *mcsv1beta1.ServiceImport) string {
	var c []string
	for _, s := range si.Status.Clusters {
		c = append(c, s.Cluster)
	}
	return strings.Join(c, ",")
}

// condition reads a ServiceExport condition as "Status/Reason".
func condition(cl client.Client, ns, name string, t mcsv1beta1.ServiceExportConditionType) string {
	se := &mcsv1beta1.ServiceExport{}
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se); err != nil {
		return err.Error()
	}
	c := meta.FindStatusCondition(se.Status.Conditions, string(t))
	if c == nil {
		return "none"
	}
	return fmt.Sprintf("%s/%s", c.Status, c.Reason)
}

func wantCondition(cl client.Client, ns, name string, t mcsv1beta1.ServiceExportConditionType, want string) func() error {
	return func() error {
		if got := condition(cl, ns, name, t); got != want {
			return fmt.Errorf("%s condition %s, want %s", t, got, want)
		}
		return nil
	}
}

// wantEvent finds an Event on an object with the reason and type whose
// message contains text.
func wantEvent(cl client.Client, ns, object, reason, typ, text string) func() error {
	return func() error {
		evs := &corev1.EventList{}
		if err := cl.List(context.Background(), evs, client.InNamespace(ns)); err != nil {
			return err
		}
		var its []string
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == object && e.Reason == reason && e.Type == typ && strings.Contains(e.Message, text) {
				return nil
			}
			if e.InvolvedObject.Name == object {
				its = append(its, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Message))
			}
		}
		return fmt.Errorf("no %s %s Event on %s/%s containing %q among %d; its own: %q", typ, reason, ns, object, text, len(evs.Items), its)
	}
}

func prefixContains(cidr, ip string) bool {
	p, err := netip.ParsePrefix(cidr)
	a, err2 := netip.ParseAddr(ip)
	return err == nil && err2 == nil && p.Contains(a)
}

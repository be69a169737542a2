//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	sdtypes "github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// dnsWorld is two clusters running `controller --cloudmap-dns --mcs=false`
// beside a private DNS namespace holding an ECS service with two tasks.
type dnsWorld struct {
	*world
	c            *sd.Client
	privateNS    string // Cloud Map namespace ids
	httpNS       string
	notAllowedNS string
	ecsServiceID string
	ecs          map[string]cloudmapdns.Attrs
}

const driftPeriod = 2 * time.Second

// The controllers run as the chart's ServiceAccount for this mode alone,
// limited to the Cloud Map namespaces the scenarios use.
func TestCloudMapDNS(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	asSA, configs := w.chartServiceAccount(t, loadChart(t), map[string]any{"region": "us-east-1",
		"mcs": map[string]any{"enabled": false}, "cloudmapDNS": map[string]any{"enabled": true}})
	checkAccess(t, configs[w.env.Clusters[0].Config.Host], []access{
		{authzv1.ResourceAttributes{Verb: "create", Resource: "namespaces"}, false},
		{authzv1.ResourceAttributes{Verb: "list", Resource: "pods"}, false},
		{authzv1.ResourceAttributes{Verb: "create", Group: "multicluster.x-k8s.io", Resource: "serviceimports", Namespace: "default"}, false},
		{authzv1.ResourceAttributes{Verb: "update", Resource: "services", Namespace: "default"}, true},
	})
	startIn := func(region string) func() {
		return w.startControllers(t, func(o *controller.Options) {
			asSA(o)
			o.MCS, o.CloudMapDNS, o.DriftPeriod = false, true, driftPeriod
			o.CloudMapDNSNamespaces = []string{"test-namespace", "http-ns", "no-such-namespace"}
			if region != "" {
				o.Region = region
			}
		})
	}
	start := func() func() { return startIn("") }
	stop := start()
	t.Cleanup(func() { stop() })
	d := &dnsWorld{world: w, c: w.cloudMap(t)}
	d.ecsNamespace(t)
	for _, ns := range []string{"web", "web2", "bad"} {
		w.allNamespaces(t, ns)
	}
	t.Run("beside ECS, scaling", d.besideECS)
	t.Run("drift repair", d.drift)
	t.Run("conflict and deletion", d.conflict)
	t.Run("created service, annotations removed", d.created)
	t.Run("bad input", d.badInput)
	t.Run("withdrawal after a restart", func(t *testing.T) {
		d.afterRestart(t, func() { stop(); stop = start() })
	})
	t.Run("a deletion during a restart in the wrong Region is held", func(t *testing.T) {
		d.wrongRegion(t, func(region string) { stop(); stop = startIn(region) })
	})
	t.Run("claims are exclusive", d.exclusive)
	t.Run("a lost claim", d.lostClaim)
	t.Run("a renamed cluster keeps its registrations", func(t *testing.T) {
		d.renamed(t, func() { stop(); stop = start() })
	})
	t.Run("the IAM policy allows exactly the calls made", func(t *testing.T) { checkPolicy(t, "cloudmap-dns", w.calls.Snapshot()) })
}

// ecsNamespace makes what an ECS service with service discovery leaves in
// Cloud Map: a private DNS namespace, an A-record service, task instances.
func (d *dnsWorld) ecsNamespace(t *testing.T) {
	ctx := context.Background()
	d.privateNS = cloudmaptest.DNSNamespace(t, d.c, "test-namespace", "vpc-0example")
	d.httpNS = cloudmaptest.Namespace(t, d.c, "http-ns")
	// One the controllers are not allowed to register in.
	d.notAllowedNS = cloudmaptest.Namespace(t, d.c, "not-allowed-ns")
	svc, err := d.c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("nginx-service"), NamespaceId: aws.String(d.privateNS),
		DnsConfig: &sdtypes.DnsConfig{RoutingPolicy: sdtypes.RoutingPolicyMultivalue, DnsRecords: []sdtypes.DnsRecord{{Type: sdtypes.RecordTypeA, TTL: aws.Int64(60)}}}})
	harness.Must(t, err)
	d.ecsServiceID = aws.ToString(svc.Service.Id)
	d.ecs = map[string]cloudmapdns.Attrs{}
	for i, ip := range []string{"172.31.10.11", "172.31.10.12"} {
		id := fmt.Sprintf("3f1c2b9e8d7a4c5b%016d", i)
		a := cloudmapdns.Attrs{"AWS_INSTANCE_IPV4": ip, "AWS_INIT_HEALTH_STATUS": "HEALTHY", "AVAILABILITY_ZONE": "us-east-1a", "REGION": "us-east-1",
			"ECS_CLUSTER_NAME": "prod", "ECS_SERVICE_NAME": "nginx-service", "ECS_TASK_DEFINITION_FAMILY": "nginx"}
		registerInstance(t, d.c, aws.ToString(svc.Service.Id), id, a)
		d.ecs[id] = a
	}
}

// registerInstance writes an instance, as another tool would, and waits
// for its operation.
func registerInstance(t *testing.T, c *sd.Client, serviceID, id string, attrs map[string]string) {
	t.Helper()
	cloudmaptest.Written(t, c, func(ctx context.Context) (*string, error) {
		out, err := c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(serviceID), InstanceId: aws.String(id), Attributes: attrs})
		if err != nil {
			return nil, err
		}
		return out.OperationId, nil
	})
}

func deregisterInstance(t *testing.T, c *sd.Client, serviceID, id string) {
	t.Helper()
	cloudmaptest.Written(t, c, func(ctx context.Context) (*string, error) {
		out, err := c.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: aws.String(serviceID), InstanceId: aws.String(id)})
		if err != nil {
			return nil, err
		}
		return out.OperationId, nil
	})
}

// annotated deploys an app whose headless Service asks to be registered.
func annotated(t *testing.T, cl client.Client, ns, name string, replicas int32, cmNamespace, hostname string) {
	t.Helper()
	app(t, cl, ns, name, replicas, true, httpPort(80, 8080))
	setAnnotations(t, cl, ns, name, map[string]string{cloudmapdns.AnnotationNamespace: cmNamespace, cloudmapdns.AnnotationHostname: hostname})
}

func setAnnotations(t *testing.T, cl client.Client, ns, name string, ann map[string]string) {
	t.Helper()
	svc := &corev1.Service{}
	harness.Must(t, cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc))
	base := svc.DeepCopy()
	svc.Annotations = ann
	harness.Must(t, cl.Patch(context.Background(), svc, client.MergeFrom(base)))
}

func removeAnnotations(t *testing.T, cl client.Client, ns, name string, keys ...string) {
	t.Helper()
	svc := &corev1.Service{}
	harness.Must(t, cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc))
	base := svc.DeepCopy()
	for _, k := range keys {
		delete(svc.Annotations, k)
	}
	harness.Must(t, cl.Patch(context.Background(), svc, client.MergeFrom(base)))
}

func (d *dnsWorld) instances(serviceID string) (map[string]cloudmapdns.Attrs, error) {
	out, err := d.c.ListInstances(context.Background(), &sd.ListInstancesInput{ServiceId: aws.String(serviceID)})
	if err != nil {
		return nil, err
	}
	m := map[string]cloudmapdns.Attrs{}
	for _, in := range out.Instances {
		m[aws.ToString(in.Id)] = in.Attributes
	}
	return m, nil
}

// registered checks that a Cloud Map service holds exactly ips from the
// owner, with the port and the attributes naming where they come from, and
// that every instance in foreign is there unchanged.
func (d *dnsWorld) registered(serviceID, owner string, ips []string, foreign map[string]cloudmapdns.Attrs) func() error {
	return func() error {
		cur, err := d.instances(serviceID)
		if err != nil {
			return err
		}
		var got []string
		for id, a := range cur {
			if f, ok := foreign[id]; ok {
				if !maps.Equal(f, a) {
					return fmt.Errorf("foreign instance %s changed: %v", id, a)
				}
				continue
			}
			if a[cloudmapdns.AttrOwner] != owner {
				continue
			}
			if a["AWS_INSTANCE_PORT"] != "8080" || a[cloudmapdns.AttrPod] == "" || a[cloudmapdns.AttrService] == "" || a[cloudmapdns.AttrCluster] == "" {
				return fmt.Errorf("instance %s lacks attributes: %v", id, a)
			}
			got = append(got, a["AWS_INSTANCE_IPV4"])
		}
		for id := range foreign {
			if _, ok := cur[id]; !ok {
				return fmt.Errorf("foreign instance %s is gone", id)
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, ips) {
			return fmt.Errorf("registered %v, want %v", got, ips)
		}
		return nil
	}
}

// owner is the AttrOwner value of a Service, read back from what the
// controller registered (the cluster name is the controller's choice).
func (d *dnsWorld) owner(t *testing.T, serviceID, ns, name string) string {
	t.Helper()
	var owner string
	harness.Eventually(t, importDeadline, "an instance of "+ns+"/"+name, func() error {
		cur, err := d.instances(serviceID)
		if err != nil {
			return err
		}
		for _, a := range cur {
			if a[cloudmapdns.AttrNamespace] == ns && a[cloudmapdns.AttrService] == name {
				owner = a[cloudmapdns.AttrOwner]
				return nil
			}
		}
		return fmt.Errorf("none among %d", len(cur))
	})
	return owner
}

func serviceCondition(cl client.Client, ns, name, want string) func() error {
	return func() error {
		svc := &corev1.Service{}
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		c := meta.FindStatusCondition(svc.Status.Conditions, cloudmapdns.ConditionRegistered)
		if c == nil {
			return fmt.Errorf("no condition, want %s", want)
		}
		if got := string(c.Status) + "/" + c.Reason; got != want {
			return fmt.Errorf("condition %s (%s), want %s", got, c.Message, want)
		}
		return nil
	}
}

func (d *dnsWorld) besideECS(t *testing.T) {
	cl := d.clients[0]
	annotated(t, cl, "web", "nginx", 3, "test-namespace", "nginx-service")
	owner := d.owner(t, d.ecsServiceID, "web", "nginx")
	for _, n := range []int32{3, 6, 1, 3} {
		harness.Scale(t, cl, "web", "nginx", n)
		ips := waitPods(t, cl, "web", "nginx", int(n))
		harness.Eventually(t, importDeadline, fmt.Sprintf("%d pods registered beside ECS", n), d.registered(d.ecsServiceID, owner, ips, d.ecs))
	}
	harness.Eventually(t, importDeadline, "condition", serviceCondition(cl, "web", "nginx", "True/Registered"))
	harness.Eventually(t, 5*time.Second, "Registered Event", wantEvent(cl, "web", "nginx", "Registered", corev1.EventTypeNormal, "to test-namespace/nginx-service"))
	harness.Eventually(t, 5*time.Second, "Deregistered Event", wantEvent(cl, "web", "nginx", "Deregistered", corev1.EventTypeNormal, "from test-namespace/nginx-service"))
}

// drift: an owned instance deregistered and one changed behind our back
// come back, a leftover owned instance with no pod goes, and a foreign
// instance deregistered behind our back stays gone.
func (d *dnsWorld) drift(t *testing.T) {
	cl := d.clients[0]
	ips := waitPods(t, cl, "web", "nginx", 3)
	owner := d.owner(t, d.ecsServiceID, "web", "nginx")
	cur, err := d.instances(d.ecsServiceID)
	harness.Must(t, err)
	var owned []string
	for id, a := range cur {
		if a[cloudmapdns.AttrOwner] == owner {
			owned = append(owned, id)
		}
	}
	sort.Strings(owned)
	// Each change behind the controller's back has happened before the
	// test looks for its repair.
	deregisterInstance(t, d.c, d.ecsServiceID, owned[0])
	changed := maps.Clone(cur[owned[1]])
	changed["AWS_INSTANCE_PORT"] = "9999"
	registerInstance(t, d.c, d.ecsServiceID, owned[1], changed)
	leftover := maps.Clone(cur[owned[2]])
	leftover["AWS_INSTANCE_IPV4"], leftover[cloudmapdns.AttrPod] = "10.99.99.99", "gone-pod"
	registerInstance(t, d.c, d.ecsServiceID, cloudmapdns.InstanceID(owner, "10.99.99.99"), leftover)
	var gone string
	for id := range d.ecs {
		gone = id
		break
	}
	deregisterInstance(t, d.c, d.ecsServiceID, gone)
	remaining := maps.Clone(d.ecs)
	delete(remaining, gone)
	harness.Eventually(t, 3*driftPeriod+5*time.Second, "drift repaired", d.registered(d.ecsServiceID, owner, ips, remaining))
	harness.Eventually(t, 5*time.Second, "DriftRepaired Event", wantEvent(cl, "web", "nginx", "DriftRepaired", corev1.EventTypeNormal, "Restored"))
	harness.Eventually(t, 5*time.Second, "StaleRemoved Event", wantEvent(cl, "web", "nginx", "StaleRemoved", corev1.EventTypeNormal, "10.99.99.99"))
	// The foreign instance stays gone through more drift cycles.
	time.Sleep(2 * driftPeriod)
	harness.Must(t, d.registered(d.ecsServiceID, owner, ips, remaining)())
	d.ecs = remaining
}

// conflict: the first Service keeps the name; the others, in another
// namespace of the same cluster and in another cluster, get a
// DomainConflict; deleting the first deregisters it and lets one take over.
func (d *dnsWorld) conflict(t *testing.T) {
	ctx := context.Background()
	first, second := d.clients[0], d.clients[1]
	owner := d.owner(t, d.ecsServiceID, "web", "nginx")
	firstIPs := waitPods(t, first, "web", "nginx", 3)
	annotated(t, first, "web2", "nginx", 1, "test-namespace", "nginx-service")
	annotated(t, second, "web", "nginx", 2, "test-namespace", "nginx-service")
	for i, cl := range []client.Client{first, second} {
		ns := []string{"web2", "web"}[i]
		harness.Eventually(t, importDeadline, "conflict condition", serviceCondition(cl, ns, "nginx", "False/DomainConflict"))
		harness.Eventually(t, 5*time.Second, "DomainConflict Event", wantEvent(cl, ns, "nginx", "DomainConflict", corev1.EventTypeWarning, "already claimed by "+owner))
	}
	harness.Must(t, d.registered(d.ecsServiceID, owner, firstIPs, d.ecs)())
	// The same-cluster contender leaves; then the holder is deleted.
	harness.Must(t, first.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web2", Name: "nginx"}}))
	harness.Must(t, first.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "nginx"}}))
	harness.Eventually(t, importDeadline, "deleted Service deregistered", d.registered(d.ecsServiceID, owner, nil, d.ecs))
	harness.Eventually(t, importDeadline, "Service gone once deregistered", func() error {
		err := first.Get(ctx, client.ObjectKey{Namespace: "web", Name: "nginx"}, &corev1.Service{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %v", err)
	})
	// The other cluster's contender polls the claim and takes over.
	secondIPs := waitPods(t, second, "web", "nginx", 2)
	newOwner := d.owner(t, d.ecsServiceID, "web", "nginx")
	if newOwner == owner {
		t.Fatalf("owner still %s", owner)
	}
	harness.Eventually(t, 15*time.Second+importDeadline, "the second takes over (other clusters poll every 15 s)", d.registered(d.ecsServiceID, newOwner, secondIPs, d.ecs))
	harness.Eventually(t, importDeadline, "its condition", serviceCondition(second, "web", "nginx", "True/Registered"))
}

// created: a hostname new to Cloud Map gets a service (A and SRV records in
// a DNS namespace, none in an HTTP one) that goes once our instances go.
func (d *dnsWorld) created(t *testing.T) {
	ctx := context.Background()
	cl := d.clients[0]
	annotated(t, cl, "web", "fresh", 2, "test-namespace", "fresh")
	annotated(t, cl, "web", "api", 1, "http-ns", "api")
	for _, c := range []struct{ nsID, name, app string }{{d.privateNS, "fresh", "fresh"}, {d.httpNS, "api", "api"}} {
		id := d.serviceID(t, c.nsID, c.name)
		got, err := d.c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(id)})
		harness.Must(t, err)
		if c.nsID == d.httpNS {
			if got.Service.DnsConfig != nil {
				t.Errorf("HTTP namespace service has DNS config %+v", got.Service.DnsConfig)
			}
		} else {
			dc := got.Service.DnsConfig
			if dc == nil || dc.RoutingPolicy != sdtypes.RoutingPolicyMultivalue || len(dc.DnsRecords) != 2 ||
				dc.DnsRecords[0].Type != sdtypes.RecordTypeA || dc.DnsRecords[1].Type != sdtypes.RecordTypeSrv {
				t.Errorf("DNS config %+v, want MULTIVALUE A + SRV", dc)
			}
		}
		ips := waitPods(t, cl, "web", c.app, map[string]int{"fresh": 2, "api": 1}[c.app])
		owner := d.owner(t, id, "web", c.app)
		harness.Eventually(t, importDeadline, c.name+" registered", d.registered(id, owner, ips, nil))
	}
	// Annotations removed: deregistered, and the service we made is deleted.
	removeAnnotations(t, cl, "web", "fresh", cloudmapdns.AnnotationNamespace, cloudmapdns.AnnotationHostname)
	d.withdrawn(t, cl, "web", "fresh", d.privateNS, "fresh")
	harness.Must(t, cl.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "api"}}))
	harness.Eventually(t, importDeadline, "HTTP service deleted with the Service", func() error {
		if id := d.lookupService(t, d.httpNS, "api"); id != "" {
			return fmt.Errorf("service %s still there", id)
		}
		return nil
	})
}

func (d *dnsWorld) lookupService(t *testing.T, nsID, name string) string {
	t.Helper()
	out, err := d.c.ListServices(context.Background(), &sd.ListServicesInput{Filters: []sdtypes.ServiceFilter{
		{Name: sdtypes.ServiceFilterNameNamespaceId, Values: []string{nsID}}}})
	harness.Must(t, err)
	for _, s := range out.Services {
		if aws.ToString(s.Name) == name {
			return aws.ToString(s.Id)
		}
	}
	return ""
}

func (d *dnsWorld) serviceID(t *testing.T, nsID, name string) string {
	t.Helper()
	var id string
	harness.Eventually(t, importDeadline, "Cloud Map service "+name, func() error {
		if id = d.lookupService(t, nsID, name); id == "" {
			return fmt.Errorf("no service %s", name)
		}
		return nil
	})
	return id
}

// badInput: each mistake is a Warning Event and a condition, registers
// nothing, and leaves a good Service in the same namespace registered.
func (d *dnsWorld) badInput(t *testing.T) {
	cl := d.clients[0]
	annotated(t, cl, "bad", "good", 1, "test-namespace", "good")
	cases := []struct {
		name   string
		ann    map[string]string
		reason string
		text   string
	}{
		{"no-such-ns", map[string]string{cloudmapdns.AnnotationNamespace: "no-such-namespace", cloudmapdns.AnnotationHostname: "x"}, "NamespaceNotFound", `"no-such-namespace" does not exist`},
		{"bad-host", map[string]string{cloudmapdns.AnnotationNamespace: "test-namespace", cloudmapdns.AnnotationHostname: "-bad.host"}, "InvalidAnnotation", "is not a valid hostname"},
		{"only-ns", map[string]string{cloudmapdns.AnnotationNamespace: "test-namespace"}, "InvalidAnnotation", cloudmapdns.AnnotationHostname + " is missing"},
		{"only-host", map[string]string{cloudmapdns.AnnotationHostname: "only-host"}, "InvalidAnnotation", cloudmapdns.AnnotationNamespace + " is missing"},
		{"not-allowed", map[string]string{cloudmapdns.AnnotationNamespace: "not-allowed-ns", cloudmapdns.AnnotationHostname: "elsewhere"}, "InvalidAnnotation", "--cloudmap-dns-namespaces: test-namespace, http-ns"},
	}
	for _, c := range cases {
		app(t, cl, "bad", c.name, 1, true, httpPort(80, 8080))
		setAnnotations(t, cl, "bad", c.name, c.ann)
	}
	for _, c := range cases {
		harness.Eventually(t, importDeadline, c.name+" condition", serviceCondition(cl, "bad", c.name, "False/"+c.reason))
		harness.Eventually(t, 5*time.Second, c.name+" Event", wantEvent(cl, "bad", c.name, c.reason, corev1.EventTypeWarning, c.text))
	}
	goodID := d.serviceID(t, d.privateNS, "good")
	harness.Eventually(t, importDeadline, "good registered", d.registered(goodID, d.owner(t, goodID, "bad", "good"), waitPods(t, cl, "bad", "good", 1), nil))
	for _, name := range []string{"x", "-bad.host", "only-host", "bad-host", "only-ns"} {
		if id := d.lookupService(t, d.privateNS, name); id != "" {
			t.Errorf("a Cloud Map service %s was created from bad input", name)
		}
	}
	if id := d.lookupService(t, d.notAllowedNS, "elsewhere"); id != "" {
		t.Errorf("a Cloud Map service was created in a namespace not allowed")
	}
}

// afterRestart: a controller that restarted knows nothing of what it
// registered; annotations removed then still deregister, and the service
// it created goes.
func (d *dnsWorld) afterRestart(t *testing.T, restart func()) {
	cl := d.clients[0]
	d.registeredApp(t, cl, "late")
	restart()
	removeAnnotations(t, cl, "web", "late", cloudmapdns.AnnotationNamespace, cloudmapdns.AnnotationHostname)
	d.withdrawn(t, cl, "web", "late", d.privateNS, "late")
}

// wrongRegion: a controller restarted in a Region where the registration's
// namespace is not found holds a deleted Service's finalizer (Cloud Map
// keeps a namespace while it has services: it is looked for in the wrong
// place) rather than leave its records for ever; restarted right, it
// withdraws them and lets the Service go.
func (d *dnsWorld) wrongRegion(t *testing.T, restartIn func(region string)) {
	cl := d.clients[0]
	id, _, _ := d.registeredApp(t, cl, "relocated")
	restartIn("eu-west-1")
	harness.Must(t, cl.Delete(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "relocated"}}))
	harness.Eventually(t, importDeadline, "the held withdrawal said", serviceCondition(cl, "web", "relocated", "False/"+cloudmapdns.ReasonCloudMapError))
	harness.Eventually(t, 5*time.Second, "its Event", wantEvent(cl, "web", "relocated", cloudmapdns.ReasonCloudMapError, corev1.EventTypeWarning, "wrong Region"))
	time.Sleep(3 * time.Second)
	if got := d.lookupService(t, d.privateNS, "relocated"); got != id {
		t.Fatalf("the registration went while the controller looked in the wrong Region (service %q, want %q)", got, id)
	}
	restartIn("")
	harness.Eventually(t, importDeadline, "withdrawn and let go", func() error {
		if got := d.lookupService(t, d.privateNS, "relocated"); got != "" {
			return fmt.Errorf("service %s still there", got)
		}
		err := cl.Get(context.Background(), client.ObjectKey{Namespace: "web", Name: "relocated"}, &corev1.Service{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("the Service is still there: %v", err)
		}
		return nil
	})
}

// registeredApp deploys web/name with 2 pods, registered in the private
// DNS namespace as name, and waits until it is: the Cloud Map service id,
// the owner and the pod addresses.
func (d *dnsWorld) registeredApp(t *testing.T, cl client.Client, name string) (id, owner string, ips []string) {
	t.Helper()
	annotated(t, cl, "web", name, 2, "test-namespace", name)
	ips = waitPods(t, cl, "web", name, 2)
	id = d.serviceID(t, d.privateNS, name)
	owner = d.owner(t, id, "web", name)
	harness.Eventually(t, importDeadline, name+" registered", d.registered(id, owner, ips, nil))
	return id, owner, ips
}

// withdrawn waits until the Cloud Map service clustermap created for a
// Service is gone and the Service's finalizer with it.
func (d *dnsWorld) withdrawn(t *testing.T, cl client.Client, ns, name, cmNamespaceID, hostname string) {
	t.Helper()
	harness.Eventually(t, importDeadline, "service deleted", func() error {
		if id := d.lookupService(t, cmNamespaceID, hostname); id != "" {
			return fmt.Errorf("service %s still there", id)
		}
		return nil
	})
	harness.Eventually(t, importDeadline, "finalizer removed", func() error {
		svc := &corev1.Service{}
		if err := cl.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		if len(svc.Finalizers) > 0 {
			return fmt.Errorf("finalizers %v", svc.Finalizers)
		}
		return nil
	})
}

package cloudmapdns

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/kube"
)

// A Service deleted right after a new leader took over, while a
// registration the old leader started still runs: Cloud Map's listing
// shows only finished operations, so the new leader cannot see it. The
// finalizer must stay until that instance is deregistered; before, the
// withdrawal saw nothing and let go, and the instance stayed in DNS for
// good (the fault campaign caught it after a controller kill).
func TestWithdrawalAfterTakeOverWaitsForRunningRegistrations(t *testing.T) {
	ctx := context.Background()
	newClient, _ := emulatorWith(t, cloudmaplocal.Options{Profile: cloudmaptest.FixedOperations(fixedOperation)}, "takeover.local")

	cl, svc := webService("takeover.local")
	key := client.ObjectKeyFromObject(svc)
	req := reconcile.Request{NamespacedName: key}

	// The old leader registers (without waiting for the operation), and
	// is gone; the Service is deleted.
	serviceID := oldLeaderRegisters(t, cl, newClient(), req)
	if err := cl.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}

	// The new leader withdraws it, as its reconciles ask.
	c := newClient()
	untilWithdrawn(t, newTestReconciler(cl, c), cl, req, 30*time.Second)

	// Once every operation has ended, nothing of the Service is left.
	time.Sleep(fixedOperation + time.Second)
	noInstanceLeft(t, c, serviceID)
}

// newTestReconciler is a Reconciler as SetupWithManager leaves it, for
// calling Reconcile directly.
func newTestReconciler(cl client.Client, c *sd.Client) *Reconciler {
	r := &Reconciler{Client: cl, CloudMap: c, Cluster: "cluster-1",
		Recorder: record.NewFakeRecorder(100), Namespaces: func(string) bool { return true }}
	r.init()
	return r
}

// webService is a fake cluster holding the headless Service default/web,
// annotated for hostname web in the Cloud Map namespace ns, and one ready
// endpoint of it.
func webService(ns string) (client.Client, *corev1.Service) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web",
			Annotations: map[string]string{AnnotationNamespace: ns, AnnotationHostname: "web"}},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	return fake.NewClientBuilder().WithScheme(kube.Scheme()).WithObjects(svc, slice).WithStatusSubresource(&corev1.Service{}).Build(), svc
}

// oldLeaderRegisters reconciles req as a leader that is gone right after
// it sent its registrations (their operations still run), and returns
// the Cloud Map service it registered in.
func oldLeaderRegisters(t *testing.T, cl client.Client, c *sd.Client, req reconcile.Request) string {
	t.Helper()
	return registers(t, newTestReconciler(cl, c), req).service
}

// registers reconciles req with r until it has sent its registrations
// (their operations still run), and returns what r remembers of them.
func registers(t *testing.T, r *Reconciler, req reconcile.Request) *entry {
	t.Helper()
	for {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if e := r.entries[req.NamespacedName]; e != nil && len(e.running) > 0 {
			return e
		}
		if res.IsZero() {
			t.Fatal("nothing registered")
		}
		time.Sleep(res.RequeueAfter)
	}
}

// A new leader's first look at a Service misses a registration the old
// leader started (the listing shows only finished operations); if the
// endpoint goes before that operation ends, the new leader must still
// take its instance out. Before, it was left until the drift check, a
// minute (the full fault campaign found two such, 60 s after its last
// fault).
func TestTakeOverRereadsWhatTheOldLeaderWrote(t *testing.T) {
	newClient, _ := emulatorWith(t, cloudmaplocal.Options{Profile: cloudmaptest.FixedOperations(fixedOperation)}, "takeover.local")
	cl, svc := webService("takeover.local")
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)}
	serviceID := oldLeaderRegisters(t, cl, newClient(), req)

	// The pod goes, the new leader looks at once, and then as its
	// requeues ask (no drift check: this test calls Reconcile itself).
	endpointGoes(t, cl)
	c := newClient()
	untilSettled(t, newTestReconciler(cl, c), req)
	time.Sleep(fixedOperation + time.Second) // its deregistration's operation
	noInstanceLeft(t, c, serviceID)
}

// A leader's own re-read (a drift check) right after it wrote misses that
// write while its operation runs; if the endpoint goes before the leader
// learns of the instance again, it must still take it out. Before, it
// stayed until the next drift check, a minute (the short fault campaign
// in CI once converged in 49 s, the last item a stale record).
func TestRereadRightAfterOurWriteIsMadeAgain(t *testing.T) {
	newClient, _ := emulatorWith(t, cloudmaplocal.Options{Profile: cloudmaptest.FixedOperations(fixedOperation)}, "reread.local")
	cl, svc := webService("reread.local")
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)}
	c := newClient()
	r := leaderForAWhile(cl, c)
	e := registers(t, r, req)

	// A drift check now reads the service while the registration runs;
	// then the pod goes.
	r.markStale(e)
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	endpointGoes(t, cl)
	untilSettled(t, r, req)
	time.Sleep(fixedOperation + time.Second) // its deregistration's operation
	noInstanceLeft(t, c, e.service)
}

// An instance of this Service's owner that no endpoint backs, registered
// behind the leader's back while its own write ran, is found by the read
// taken once that write ended, not by a drift check: it is still said to
// be a stale instance removed (StaleRemoved), not an endpoint's
// deregistration. Before, the e2e drift test met a plain Deregistered
// Event for it (a clean-clone run of 244efe6).
func TestStaleInstanceFoundByAReadAgainIsSaidStale(t *testing.T) {
	ctx := context.Background()
	newClient, _ := emulatorWith(t, cloudmaplocal.Options{Profile: cloudmaptest.FixedOperations(fixedOperation)}, "stale.local")
	cl, svc := webService("stale.local")
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)}
	c := newClient()
	r := leaderForAWhile(cl, c)
	e := registers(t, r, req)
	owner := Owner(r.Cluster, svc)
	stale := Attrs{AttrIPv4: "10.0.0.99", AttrCluster: r.Cluster, AttrNamespace: svc.Namespace, AttrService: svc.Name, AttrOwner: owner, AttrPort: "8080"}
	if _, err := c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(e.service),
		InstanceId: aws.String(InstanceID(owner, "10.0.0.99")), Attributes: stale}); err != nil {
		t.Fatal(err)
	}
	// A drift check reads while both writes run (neither shows), then the
	// read once the leader's own has ended finds the stale one.
	r.markStale(e)
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	untilSettled(t, r, req)
	recorded := r.Recorder.(*record.FakeRecorder).Events
	var events []string
	for len(recorded) > 0 {
		events = append(events, <-recorded)
	}
	if !slices.ContainsFunc(events, func(ev string) bool {
		return strings.HasPrefix(ev, "Normal "+ReasonStaleRemoved+" ") && strings.Contains(ev, "10.0.0.99")
	}) {
		t.Errorf("no %s Event for 10.0.0.99 among %q", ReasonStaleRemoved, events)
	}
}

// A registration whose call failed may have been made all the same (the
// answer lost on the way back), and a re-read while its operation runs
// misses it: it too must be read again once that operation has ended, or
// its instance stays if the endpoint goes meanwhile.
func TestWriteWithALostAnswerIsReadAgain(t *testing.T) {
	c, lost := lossyEmulator(t, "lost.local")
	cl, svc := webService("lost.local")
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(svc)}
	r := leaderForAWhile(cl, c)
	untilLost(t, r, req, lost)
	// Read again at once, as after an error, then the pod goes.
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	endpointGoes(t, cl)
	untilSettled(t, r, req)
	time.Sleep(fixedOperation + time.Second)
	noInstanceLeft(t, c, r.entries[req.NamespacedName].service)
}

// The Service is deleted right after a registration whose answer was
// lost, into a Cloud Map service clustermap did not create (it stays):
// the withdrawal must wait until that registration has ended, or its
// instance stays for good (no drift check looks at a forgotten Service).
func TestWithdrawalAfterALostAnswerWaitsForIt(t *testing.T) {
	ctx := context.Background()
	c, lost := lossyEmulator(t, "lost.local")
	nsID, err := CloudMap{c}.FindNamespace(ctx, "lost.local")
	if err != nil {
		t.Fatal(err)
	}
	existing, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: aws.String(nsID.ID),
		DnsConfig: &types.DnsConfig{DnsRecords: []types.DnsRecord{{Type: types.RecordTypeA, TTL: aws.Int64(10)}}}})
	if err != nil {
		t.Fatal(err)
	}
	cl, svc := webService("lost.local")
	key := client.ObjectKeyFromObject(svc)
	req := reconcile.Request{NamespacedName: key}
	r := leaderForAWhile(cl, c)
	untilLost(t, r, req, lost)
	if err := cl.Get(ctx, key, svc); err != nil {
		t.Fatal(err)
	}
	if err := cl.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	untilWithdrawn(t, r, cl, req, cloudmapclient.OperationRun+10*time.Second)
	time.Sleep(fixedOperation + time.Second)
	noInstanceLeft(t, c, aws.ToString(existing.Service.Id))
}

// fixedOperation is how long these tests' operations run: inside the aws
// profile's 0.5-4 s, and long enough that a look right after a write
// falls inside its operation.
const fixedOperation = 3 * time.Second

// lossyEmulator is an emulator whose operations take fixedOperation, with
// one private DNS namespace, reached through a proxy that makes the
// first registration of webService's endpoint and answers it with an
// error, as when the answer is lost; lost is set then.
func lossyEmulator(t *testing.T, namespace string) (*sd.Client, *atomic.Bool) {
	em := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: cloudmaptest.FixedOperations(fixedOperation)})
	lost := &atomic.Bool{}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		body, _ := io.ReadAll(q.Body)
		q.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		em.Handler().ServeHTTP(rec, q)
		if strings.HasSuffix(q.Header.Get("X-Amz-Target"), ".RegisterInstance") && bytes.Contains(body, []byte("10.0.0.7")) && lost.CompareAndSwap(false, true) {
			w.Header().Set("Content-Type", "application/x-amz-json-1.1")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"__type":"InvalidInput","message":"the answer was lost (test)"}`))
			return
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(proxy.Close)
	c := cloudmaptest.ClientOf(t, proxy.URL, cloudmapclient.Options{})
	cloudmaptest.DNSNamespace(t, c, namespace, "vpc-1")
	return c, lost
}

// untilLost reconciles req until the registration's answer is lost.
func untilLost(t *testing.T, r *Reconciler, req reconcile.Request, lost *atomic.Bool) {
	t.Helper()
	for !lost.Load() {
		res, err := r.Reconcile(context.Background(), req)
		if err == nil && res.IsZero() {
			t.Fatal("settled without registering the endpoint")
		}
		time.Sleep(res.RequeueAfter)
	}
}

// leaderForAWhile is a reconciler that has led for a minute: what a new
// leader reads again is not what the test is about.
func leaderForAWhile(cl client.Client, c *sd.Client) *Reconciler {
	r := newTestReconciler(cl, c)
	r.leadOnce.Do(func() { r.leading = time.Now().Add(-time.Minute) })
	return r
}

// endpointGoes takes the ready endpoint of webService's Service away.
func endpointGoes(t *testing.T, cl client.Client) {
	t.Helper()
	ctx := context.Background()
	slice := &discoveryv1.EndpointSlice{}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web-1"}, slice); err != nil {
		t.Fatal(err)
	}
	slice.Endpoints = nil
	if err := cl.Update(ctx, slice); err != nil {
		t.Fatal(err)
	}
}

// untilSettled reconciles req as its requeues ask until none is asked.
func untilSettled(t *testing.T, r *Reconciler, req reconcile.Request) {
	t.Helper()
	deadline := time.Now().Add(cloudmapclient.OperationRun + 10*time.Second)
	for {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if res.IsZero() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still asks to look again: %+v", res)
		}
		time.Sleep(res.RequeueAfter)
	}
}

// untilWithdrawn reconciles the deleted Service of req with r, as its
// reconciles ask, until it is gone (its finalizer let go), for up to
// within.
func untilWithdrawn(t *testing.T, r *Reconciler, cl client.Client, req reconcile.Request, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(within); ; {
		if time.Now().After(deadline) {
			t.Fatalf("the Service still holds its finalizer %v after its deletion", within)
		}
		res, err := r.Reconcile(ctx, req)
		if apierrors.IsNotFound(cl.Get(ctx, req.NamespacedName, &corev1.Service{})) {
			return
		}
		switch {
		case err != nil:
			time.Sleep(200 * time.Millisecond)
		case res.RequeueAfter > 0:
			time.Sleep(res.RequeueAfter)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// noInstanceLeft fails unless the Cloud Map service holds no instance.
func noInstanceLeft(t *testing.T, c *sd.Client, serviceID string) {
	t.Helper()
	out, err := c.ListInstances(context.Background(), &sd.ListInstancesInput{ServiceId: aws.String(serviceID)})
	if IsServiceGone(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Instances) > 0 {
		t.Errorf("the instance %s is still registered", aws.ToString(out.Instances[0].Id))
	}
}

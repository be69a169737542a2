package cloudmapdns

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

// Cloud Map accepts a registration, then fails it: the Service is
// registered again within seconds, and its condition says so meanwhile.
// Before, memory counted the write as done and only the next drift check
// (a minute at the shipped default) wrote it again: the fault campaign
// saw a DNS record missing 30 s after its last fault.
func TestLateFailedWriteIsWrittenAgain(t *testing.T) {
	ctx := context.Background()
	// Operations take 1 s; late failures come only from the fault below.
	srv := cloudmaptest.Start(t, cloudmaplocal.Options{Profile: cloudmaptest.FixedOperations(time.Second)})
	c := srv.Client(t, cloudmapclient.Options{})
	cloudmaptest.DNSNamespace(t, c, "late.local", "vpc-1")

	cl, svc := webService("late.local")
	key := client.ObjectKeyFromObject(svc)
	r := newTestReconciler(cl, c)
	events := r.Recorder.(*record.FakeRecorder).Events

	// Every operation fails until the first registration has ended.
	srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key})
	for err == nil && res.RequeueAfter > 0 && r.entries[key] == nil {
		time.Sleep(res.RequeueAfter)
		res, err = r.Reconcile(ctx, reconcile.Request{NamespacedName: key})
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(r.entries[key].running) != 1 {
		t.Fatalf("the registration's operation is not followed: %v", r.entries[key].running)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, err := c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String(r.entries[key].running[0])})
		if err != nil {
			t.Fatal(err)
		}
		if out.Operation.Status == types.OperationStatusFail {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registration's operation is %s 10 s on, want FAIL", out.Operation.Status)
		}
	}
	srv.SetFaults(cloudmaplocal.Faults{})
	serviceID := r.entries[key].service
	if n := instances(t, c, serviceID); n != 0 {
		t.Fatalf("%d instances registered while every operation failed", n)
	}

	// The Service's reconciles, as the requeues ask, and nothing else (no
	// drift check: this test calls Reconcile itself).
	sawFailure := false
	deadline := time.Now().Add(20 * time.Second)
	for instances(t, c, serviceID) == 0 || res.RequeueAfter > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the registration Cloud Map failed was not written again within 20 s (next reconcile asked for: %+v)", res)
		}
		if res.IsZero() {
			t.Fatal("the reconciler asks for no further look while its registration failed")
		}
		time.Sleep(res.RequeueAfter)
		if res, err = r.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
		got := &corev1.Service{}
		if err := cl.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, ConditionRegistered); c != nil && c.Reason == ReasonCloudMapError && strings.Contains(c.Message, "then failed it") {
			sawFailure = true
		}
	}
	if !sawFailure {
		t.Error("the Service's condition never said its write failed")
	}
	if !drained(events, "Warning "+ReasonCloudMapError) {
		t.Error("no Warning Event said the write failed")
	}
	got := &corev1.Service{}
	if err := cl.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, ConditionRegistered); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition once written again: %+v, want True", c)
	}
}

func instances(t *testing.T, c *sd.Client, serviceID string) int {
	t.Helper()
	out, err := c.ListInstances(context.Background(), &sd.ListInstancesInput{ServiceId: aws.String(serviceID)})
	if err != nil {
		t.Fatal(err)
	}
	return len(out.Instances)
}

// drained reads the Events recorded so far and says whether one starts with prefix.
func drained(events chan string, prefix string) bool {
	found := false
	for {
		select {
		case e := <-events:
			found = found || strings.HasPrefix(e, prefix)
		default:
			return found
		}
	}
}

package cloudmapclient_test

import (
	"context"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

// Each way an instance write ends is named once, against the emulator
// under the aws profile (asynchronous operations): accepted with an
// operation, a write of the instance still running, a namespace's instance
// quota, a deregistration of an instance not there, a service not there.
func TestWriteInstancesNamesEachOutcome(t *testing.T) {
	api := cloudmaptest.Start(t, cloudmaplocal.Options{MaxInstancesPerNamespace: 2})
	c := api.Client(t, cloudmapclient.Options{})
	ctx := context.Background()
	ns := cloudmaptest.Namespace(t, c, "apps")
	svc, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: aws.String(ns)})
	if err != nil {
		t.Fatal(err)
	}
	id := aws.ToString(svc.Service.Id)
	attrs := map[string]string{"AWS_INSTANCE_IPV4": "10.0.0.1"}
	write := func(ws ...cloudmapclient.Write) []cloudmapclient.Outcome {
		t.Helper()
		var mu sync.Mutex
		out := make([]cloudmapclient.Outcome, len(ws))
		err := cloudmapclient.WriteInstances(ctx, c, id, ws, func(i int, o cloudmapclient.Outcome) error {
			mu.Lock()
			defer mu.Unlock()
			out[i] = o
			return o.Err
		})
		var want error
		for _, o := range out {
			if o.Err != nil {
				want = o.Err
			}
		}
		if (err == nil) != (want == nil) {
			t.Fatalf("WriteInstances returned %v; the outcomes' errors were %v", err, want)
		}
		return out
	}
	first := write(cloudmapclient.Write{ID: "a", Attributes: attrs}, cloudmapclient.Write{ID: "b", Attributes: attrs})
	for i, o := range first {
		if o.Op == "" || o.Err != nil {
			t.Fatalf("registration %d: %+v, want an operation", i, o)
		}
	}
	// Both still run (0.5 s at least): a second write of "a" is refused.
	if o := write(cloudmapclient.Write{ID: "a"})[0]; !o.Busy || o.Op != "" {
		t.Errorf("a write of an instance whose write runs: %+v, want Busy", o)
	}
	for _, op := range first {
		if _, err := cloudmapclient.WaitOperation(ctx, c, aws.String(op.Op)); err != nil {
			t.Fatal(err)
		}
	}
	if o := write(cloudmapclient.Write{ID: "c", Attributes: attrs})[0]; o.Full == "" {
		t.Errorf("a third instance in a namespace of quota 2: %+v, want Full", o)
	}
	if o := write(cloudmapclient.Write{ID: "none"})[0]; !o.Missing {
		t.Errorf("a deregistration of no instance: %+v, want Missing", o)
	}
	other := aws.String("svc-0000000000000000")
	if err := cloudmapclient.WriteInstances(ctx, c, aws.ToString(other), []cloudmapclient.Write{{ID: "a", Attributes: attrs}}, func(_ int, o cloudmapclient.Outcome) error {
		if !o.NoService {
			t.Errorf("a registration in no service: %+v, want NoService", o)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

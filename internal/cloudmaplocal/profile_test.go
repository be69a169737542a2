package cloudmaplocal_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

// The aws profile is the default: a fixture given no profile behaves as
// Cloud Map does, operations included.
func TestAWSProfileIsTheDefault(t *testing.T) {
	ctx := context.Background()
	c := cloudmaptest.Start(t, cloudmaplocal.Options{}).Client(t, cloudmapclient.Options{})
	op := must[*sd.CreateHttpNamespaceOutput](t)(c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String("default")}))
	st := must[*sd.GetOperationOutput](t)(c.GetOperation(ctx, &sd.GetOperationInput{OperationId: op.OperationId})).Operation
	if st.Status != types.OperationStatusSubmitted {
		t.Errorf("an operation just accepted under the default profile is %s, want SUBMITTED", st.Status)
	}
}

// Under a profile with read lag, a read right after an operation succeeded
// may show the state before it (reads may even go backwards); once the lag
// window has passed, every read shows it.
func TestReadLag(t *testing.T) {
	ctx := context.Background()
	lag := 1500 * time.Millisecond
	p := cloudmaplocal.Instant()
	p.ReadLag = lag
	_, c, _ := emulator(t, cloudmaplocal.Options{Profile: &p}, cloudmapclient.Options{})
	svc := httpService(t, c, "lag", "web")
	read := func() (int, int64) {
		out := must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("lag"), ServiceName: aws.String("web")}))
		return len(out.Instances), aws.ToInt64(out.InstancesRevision)
	}
	_, before := read()
	op := must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, "i-1", map[string]string{"AWS_INSTANCE_IPV4": "10.3.0.1"}))
	done := time.Now()
	opDone(t, c, op.OperationId)
	stale, fresh := 0, 0
	for range 20 {
		n, rev := read()
		switch {
		case n == 0 && rev == before:
			stale++
		case n == 1 && rev > before:
			fresh++
		default:
			t.Fatalf("a read shows %d instances at revision %d (before the write: 0 at %d): instances and revision disagree", n, rev, before)
		}
	}
	if time.Since(done) < lag/10 && stale == 0 {
		t.Errorf("20 reads right after the operation succeeded all showed it: the data plane does not lag")
	}
	time.Sleep(time.Until(done.Add(lag)))
	for range 20 {
		if n, rev := read(); n != 1 || rev <= before {
			t.Fatalf("a read past the lag window shows %d instances at revision %d: want the write", n, rev)
		}
	}
	if rev := aws.ToInt64(must[*sd.DiscoverInstancesRevisionOutput](t)(c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{
		NamespaceName: aws.String("lag"), ServiceName: aws.String("web")})).InstancesRevision); rev <= before {
		t.Errorf("DiscoverInstancesRevision past the lag window: %d, want past %d", rev, before)
	}
}

// ListOperations takes a page of all the account's operations, other
// tenants' included, and filters it after: the page that holds no match
// still leads on to the one that does.
func TestListOperationsPagesBeforeFiltering(t *testing.T) {
	ctx := context.Background()
	p := cloudmaplocal.Instant()
	p.TenantOperations = 2000
	_, c, _ := emulator(t, cloudmaplocal.Options{Profile: &p}, cloudmapclient.Options{})
	svc := httpService(t, c, "busy", "web")
	op := must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, "i-1", map[string]string{"AWS_INSTANCE_IPV4": "10.3.0.2"}))
	must[*sd.ListOperationsOutput](t)(c.ListOperations(ctx, &sd.ListOperationsInput{})) // the tenants' clock starts
	time.Sleep(300 * time.Millisecond)                                                  // ~600 of their operations
	mine := []types.OperationFilter{{Name: types.OperationFilterNameServiceId, Values: []string{svc}}}
	first := must[*sd.ListOperationsOutput](t)(c.ListOperations(ctx, &sd.ListOperationsInput{Filters: mine}))
	if len(first.Operations) != 0 || first.NextToken == nil {
		t.Fatalf("the first page of a busy account: %d matching operations, next token %v; want none and a token", len(first.Operations), first.NextToken)
	}
	pages, found := 0, false
	for pg := sd.NewListOperationsPaginator(c, &sd.ListOperationsInput{Filters: mine}); pg.HasMorePages(); {
		pages++
		for _, o := range must[*sd.ListOperationsOutput](t)(pg.NextPage(ctx)).Operations {
			found = found || aws.ToString(o.Id) == aws.ToString(op.OperationId)
		}
	}
	if !found || pages < 5 {
		t.Errorf("paging the filter through: found %v after %d pages; want it found, several pages in", found, pages)
	}
	// The other tenants' operations are the account's, readable as such.
	all := must[*sd.ListOperationsOutput](t)(c.ListOperations(ctx, &sd.ListOperationsInput{}))
	other := must[*sd.GetOperationOutput](t)(c.GetOperation(ctx, &sd.GetOperationInput{OperationId: all.Operations[0].Id})).Operation
	if other.Targets["SERVICE"] == svc || other.Status != types.OperationStatusSuccess {
		t.Errorf("a tenant's operation: %+v", other)
	}
}

// Control-plane calls have a quota per operation, account and Region; the
// data plane has AWS's own.
func TestProfileQuotas(t *testing.T) {
	ctx := context.Background()
	p := cloudmaplocal.Instant()
	p.ControlRate = cloudmaplocal.RateLimit{Rate: 0.001, Burst: 2}
	p.DataRates = map[string]cloudmaplocal.RateLimit{"DiscoverInstancesRevision": {Rate: 0.001, Burst: 1}}
	_, c, _ := emulator(t, cloudmaplocal.Options{Profile: &p}, cloudmapclient.Options{MaxAttempts: 1})
	for range 2 {
		must[*sd.ListNamespacesOutput](t)(c.ListNamespaces(ctx, &sd.ListNamespacesInput{}))
	}
	_, err := c.ListNamespaces(ctx, &sd.ListNamespacesInput{})
	wantErr(t, err, "RequestLimitExceeded")
	// Each operation has its own bucket.
	must[*sd.ListServicesOutput](t)(c.ListServices(ctx, &sd.ListServicesInput{}))
	rev := &sd.DiscoverInstancesRevisionInput{NamespaceName: aws.String("none"), ServiceName: aws.String("none")}
	_, err = c.DiscoverInstancesRevision(ctx, rev)
	wantErr(t, err, "NamespaceNotFound")
	_, err = c.DiscoverInstancesRevision(ctx, rev)
	wantErr(t, err, "RequestLimitExceeded")
}

// A share of operations is accepted, then fails.
func TestLateFailures(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := cloudmaplocal.New(cloudmaplocal.Options{DataDir: dir, Profile: cloudmaptest.Instant().Profile})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(srv.Handler())
	c, _ := cloudmapclient.New(ctx, cloudmapclient.Options{Endpoint: api.URL, Region: "us-east-1", Credentials: cloudmapclient.LocalCredentials})
	svc := httpService(t, c, "late", "web")
	api.Close()
	srv.Close()

	p := cloudmaplocal.Instant()
	p.OperationTime = cloudmaplocal.Spread{Min: 50 * time.Millisecond, Max: 100 * time.Millisecond}
	p.LateFailureRate = 1
	_, c, _ = emulator(t, cloudmaplocal.Options{Profile: &p, DataDir: dir}, cloudmapclient.Options{})
	op := must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, "i-1", map[string]string{"AWS_INSTANCE_IPV4": "10.3.0.3"}))
	if _, err := cloudmapclient.WaitOperation(ctx, c, op.OperationId); err == nil {
		t.Fatal("an operation under a late-failure rate of 1 succeeded")
	}
	st := must[*sd.GetOperationOutput](t)(c.GetOperation(ctx, &sd.GetOperationInput{OperationId: op.OperationId})).Operation
	if st.Status != types.OperationStatusFail {
		t.Errorf("the operation ended %s, want FAIL", st.Status)
	}
	_, err = c.GetInstance(ctx, &sd.GetInstanceInput{ServiceId: aws.String(svc), InstanceId: aws.String("i-1")})
	wantErr(t, err, "InstanceNotFound")
}

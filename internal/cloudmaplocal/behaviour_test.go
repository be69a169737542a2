package cloudmaplocal_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

// httpService makes a namespace and service and returns the service id.
func httpService(t testing.TB, c *sd.Client, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	op := must[*sd.CreateHttpNamespaceOutput](t)(c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String(ns)}))
	nsID := opDone(t, c, op.OperationId)["NAMESPACE"]
	svc := must[*sd.CreateServiceOutput](t)(c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String(name), NamespaceId: aws.String(nsID)}))
	return aws.ToString(svc.Service.Id)
}

func register(ctx context.Context, c *sd.Client, svc, id string, attrs map[string]string) (*sd.RegisterInstanceOutput, error) {
	return c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(svc), InstanceId: aws.String(id), Attributes: attrs})
}

// counter reads the emulator's request counter for an operation and code,
// every account and Region together.
func counter(t *testing.T, admin, op, code string) int {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range families["cloudmaplocal_requests_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["operation"] == op && labels["code"] == code {
			n += int(m.GetCounter().GetValue())
		}
	}
	return n
}

func putFaults(t *testing.T, admin, faults string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, admin+"/faults", strings.NewReader(faults))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT /faults %s: %d", faults, resp.StatusCode)
	}
}

// Throttling and outages reach the SDK as RequestLimitExceeded and 503,
// which its standard retryer retries (3 attempts) before giving up.
func TestFaultsDriveTheSDKRetryer(t *testing.T) {
	ctx := context.Background()
	srv, c, _ := emulator(t, cloudmaplocal.Options{}, cloudmapclient.Options{})
	admin := httptest.NewServer(srv.AdminHandler())
	defer admin.Close()
	httpService(t, c, "faults", "web")
	discover := func() error {
		_, err := c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("faults"), ServiceName: aws.String("web")})
		return err
	}

	putFaults(t, admin.URL, `{"rateLimits": {"DiscoverInstances": {"rate": 0.001, "burst": 1}}}`)
	if err := discover(); err != nil {
		t.Fatalf("first call within the burst: %v", err)
	}
	err := discover()
	wantErr(t, err, "RequestLimitExceeded")
	if n := counter(t, admin.URL, "DiscoverInstances", "RequestLimitExceeded"); n != 3 {
		t.Errorf("the SDK made %d throttled attempts, want 3 (standard retryer)", n)
	}

	putFaults(t, admin.URL, `{"outage": true}`)
	err = discover()
	var re interface{ HTTPStatusCode() int }
	if !asStatus(err, &re) || re.HTTPStatusCode() != 503 {
		t.Fatalf("outage: want HTTP 503, got %v", err)
	}
	if n := counter(t, admin.URL, "DiscoverInstances", "ServiceUnavailable"); n != 3 {
		t.Errorf("the SDK made %d attempts during the outage, want 3", n)
	}

	putFaults(t, admin.URL, `{"errorRate": 1}`)
	err = discover()
	if !asStatus(err, &re) || re.HTTPStatusCode() != 500 {
		t.Fatalf("error rate 1: want HTTP 500, got %v", err)
	}
	putFaults(t, admin.URL, `{}`)
	if err := discover(); err != nil {
		t.Fatalf("after recovery: %v", err)
	}
	// Client errors are not retried.
	_, err = c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String(" "), ServiceName: aws.String("web")})
	wantErr(t, err, "InvalidInput")
	if n := counter(t, admin.URL, "DiscoverInstances", "InvalidInput"); n != 1 {
		t.Errorf("InvalidInput was sent %d times, want once", n)
	}
	// Unknown fields in a fault document are refused, not ignored.
	req, _ := http.NewRequest(http.MethodPut, admin.URL+"/faults", strings.NewReader(`{"outtage": true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 400 {
		t.Errorf("a misspelt fault must be refused: %v %v", err, resp.StatusCode)
	}
}

func asStatus(err error, target *interface{ HTTPStatusCode() int }) bool {
	for err != nil {
		if s, ok := err.(interface{ HTTPStatusCode() int }); ok {
			*target = s
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// A restart with --data-dir keeps every namespace, service and instance.
func TestStateSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv, err := cloudmaplocal.New(cloudmaplocal.Options{DataDir: dir, Profile: cloudmaptest.Instant().Profile})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(srv.Handler())
	c, _ := cloudmapclient.New(ctx, cloudmapclient.Options{Endpoint: api.URL, Region: "us-east-1", Credentials: cloudmapclient.LocalCredentials})
	svc := httpService(t, c, "persist", "web")
	for i := 0; i < 5; i++ {
		opDone(t, c, must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, fmt.Sprint("i-", i), map[string]string{"AWS_INSTANCE_IPV4": fmt.Sprint("10.1.0.", i)})).OperationId)
	}
	must[*sd.TagResourceOutput](t)(c.TagResource(ctx, &sd.TagResourceInput{
		ResourceARN: must[*sd.GetServiceOutput](t)(c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(svc)})).Service.Arn,
		Tags:        []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}},
	}))
	before := must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("persist"), ServiceName: aws.String("web")}))
	api.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	_, c2, _ := emulator(t, cloudmaplocal.Options{DataDir: dir}, cloudmapclient.Options{})
	after := must[*sd.DiscoverInstancesOutput](t)(c2.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("persist"), ServiceName: aws.String("web")}))
	if instanceIDs(after.Instances) != instanceIDs(before.Instances) || len(after.Instances) != 5 ||
		aws.ToInt64(after.InstancesRevision) != aws.ToInt64(before.InstancesRevision) {
		t.Errorf("after restart: %s rev %d, before: %s rev %d", instanceIDs(after.Instances), aws.ToInt64(after.InstancesRevision),
			instanceIDs(before.Instances), aws.ToInt64(before.InstancesRevision))
	}
	got := must[*sd.GetServiceOutput](t)(c2.GetService(ctx, &sd.GetServiceInput{Id: aws.String(svc)})).Service
	if aws.ToInt32(got.InstanceCount) != 5 {
		t.Errorf("service after restart: %+v", got)
	}
	tags := must[*sd.ListTagsForResourceOutput](t)(c2.ListTagsForResource(ctx, &sd.ListTagsForResourceInput{ResourceARN: got.Arn})).Tags
	if len(tags) != 1 {
		t.Errorf("tags after restart: %+v", tags)
	}
}

// Operations that take time pass through SUBMITTED and PENDING,
// a second registration of the same instance meanwhile is a DuplicateRequest,
// and the instance appears only when the operation succeeds. A restart in
// the middle finishes the operation.
func TestAsynchronousOperations(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	delay := 400 * time.Millisecond
	fixed := cloudmaplocal.Profile{OperationTime: cloudmaplocal.Spread{Min: delay, Max: delay}}
	srv, err := cloudmaplocal.New(cloudmaplocal.Options{Profile: &fixed, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(srv.Handler())
	c, _ := cloudmapclient.New(ctx, cloudmapclient.Options{Endpoint: api.URL, Region: "us-east-1", Credentials: cloudmapclient.LocalCredentials})
	svc := httpService(t, c, "async", "web")

	op := must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, "i-1", map[string]string{"AWS_INSTANCE_IPV4": "10.2.0.1"}))
	st := must[*sd.GetOperationOutput](t)(c.GetOperation(ctx, &sd.GetOperationInput{OperationId: op.OperationId})).Operation
	if st.Status != types.OperationStatusSubmitted || st.Type != types.OperationTypeRegisterInstance || st.Targets["INSTANCE"] != "i-1" {
		t.Errorf("fresh operation: %+v", st)
	}
	_, err = register(ctx, c, svc, "i-1", map[string]string{"AWS_INSTANCE_IPV4": "10.2.0.1"})
	wantErr(t, err, "DuplicateRequest")
	_, err = c.GetInstance(ctx, &sd.GetInstanceInput{ServiceId: aws.String(svc), InstanceId: aws.String("i-1")})
	wantErr(t, err, "InstanceNotFound")
	time.Sleep(delay * 6 / 10)
	if st := must[*sd.GetOperationOutput](t)(c.GetOperation(ctx, &sd.GetOperationInput{OperationId: op.OperationId})).Operation; st.Status != types.OperationStatusPending {
		t.Errorf("past half the delay: %s, want PENDING", st.Status)
	}
	pending := must[*sd.ListOperationsOutput](t)(c.ListOperations(ctx, &sd.ListOperationsInput{Filters: []types.OperationFilter{
		{Name: types.OperationFilterNameStatus, Condition: types.FilterConditionIn, Values: []string{"SUBMITTED", "PENDING"}},
	}}))
	if len(pending.Operations) != 1 || aws.ToString(pending.Operations[0].Id) != aws.ToString(op.OperationId) {
		t.Errorf("ListOperations STATUS IN (SUBMITTED, PENDING): %+v", pending.Operations)
	}
	opDone(t, c, op.OperationId)
	must[*sd.GetInstanceOutput](t)(c.GetInstance(ctx, &sd.GetInstanceInput{ServiceId: aws.String(svc), InstanceId: aws.String("i-1")}))

	// Restart while a registration is pending: it completes afterwards.
	op = must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, "i-2", map[string]string{"AWS_INSTANCE_IPV4": "10.2.0.2"}))
	api.Close()
	srv.Close()
	_, c2, _ := emulator(t, cloudmaplocal.Options{Profile: &fixed, DataDir: dir}, cloudmapclient.Options{})
	opDone(t, c2, op.OperationId)
	must[*sd.GetInstanceOutput](t)(c2.GetInstance(ctx, &sd.GetInstanceInput{ServiceId: aws.String(svc), InstanceId: aws.String("i-2")}))
}

// Injected operation failures end an operation FAIL without its effect.
func TestOperationFailureInjection(t *testing.T) {
	ctx := context.Background()
	srv, c, _ := emulator(t, cloudmaplocal.Options{}, cloudmapclient.Options{})
	svc := httpService(t, c, "opfail", "web")
	srv.SetFaults(cloudmaplocal.Faults{OperationFailureRate: 1})
	op := must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, "i-1", map[string]string{"A": "1"}))
	st := must[*sd.GetOperationOutput](t)(c.GetOperation(ctx, &sd.GetOperationInput{OperationId: op.OperationId})).Operation
	if st.Status != types.OperationStatusFail || aws.ToString(st.ErrorCode) != "INTERNAL_FAILURE" {
		t.Errorf("operation under failure injection: %+v", st)
	}
	_, err := c.GetInstance(ctx, &sd.GetInstanceInput{ServiceId: aws.String(svc), InstanceId: aws.String("i-1")})
	wantErr(t, err, "InstanceNotFound")
}

func TestQuotas(t *testing.T) {
	ctx := context.Background()
	_, c, _ := emulator(t, cloudmaplocal.Options{MaxNamespaces: 2}, cloudmapclient.Options{})
	svc := httpService(t, c, "quota", "web")

	// 1,000 instances per service, no more.
	for i := 0; i < 1000; i++ {
		if _, err := register(ctx, c, svc, fmt.Sprint("i-", i), map[string]string{"N": fmt.Sprint(i)}); err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
	}
	_, err := register(ctx, c, svc, "i-1000", map[string]string{"N": "x"})
	wantErr(t, err, "ResourceLimitExceeded")
	// Re-registering an existing id updates it and is not a new instance.
	if _, err := register(ctx, c, svc, "i-0", map[string]string{"N": "updated"}); err != nil {
		t.Fatalf("update at the quota: %v", err)
	}
	// DiscoverInstances returns at most 1,000, never pages.
	disc := must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("quota"), ServiceName: aws.String("web"), MaxResults: aws.Int32(1000)}))
	if len(disc.Instances) != 1000 {
		t.Errorf("DiscoverInstances MaxResults 1000: %d", len(disc.Instances))
	}

	attrs := map[string]string{"AWS_INSTANCE_IPV4": "10.0.0.1"}
	for i := 0; i < 31; i++ {
		attrs[fmt.Sprint("K", i)] = "v"
	}
	_, err = register(ctx, c, svc, "i-0", attrs)
	wantErr(t, err, "InvalidInput")
	_, err = register(ctx, c, svc, "i-0", map[string]string{"A": strings.Repeat("v", 1000), "B": strings.Repeat("v", 1000), "C": strings.Repeat("v", 1000), "D": strings.Repeat("v", 1000), "E": strings.Repeat("v", 1000)})
	wantErr(t, err, "InvalidInput")
	_, err = register(ctx, c, svc, strings.Repeat("x", 65), map[string]string{"A": "1"})
	wantErr(t, err, "InvalidInput")
	_, err = register(ctx, c, svc, "bad id", map[string]string{"A": "1"})
	wantErr(t, err, "InvalidInput")
	_, err = register(ctx, c, svc, "i-0", map[string]string{"AWS_INSTANCE_IPV4": "not-an-ip"})
	wantErr(t, err, "InvalidInput")

	httpService(t, c, "quota2", "web")
	_, err = c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String("quota3")})
	wantErr(t, err, "ResourceLimitExceeded")
}

func TestInstancesPerNamespaceQuota(t *testing.T) {
	ctx := context.Background()
	_, c, _ := emulator(t, cloudmaplocal.Options{MaxInstancesPerNamespace: 3}, cloudmapclient.Options{})
	svc := httpService(t, c, "nsquota", "a")
	nsID := must[*sd.GetServiceOutput](t)(c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(svc)})).Service.NamespaceId
	other := aws.ToString(must[*sd.CreateServiceOutput](t)(c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("b"), NamespaceId: nsID})).Service.Id)
	for i, s := range []string{svc, svc, other} {
		if _, err := register(ctx, c, s, fmt.Sprint("i-", i), map[string]string{"A": "1"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := register(ctx, c, other, "i-3", map[string]string{"A": "1"})
	wantErr(t, err, "ResourceLimitExceeded")
}

// Creates are idempotent per CreatorRequestId, as the SDK's retries need.
func TestIdempotentCreates(t *testing.T) {
	ctx := context.Background()
	_, c, _ := emulator(t, cloudmaplocal.Options{}, cloudmapclient.Options{})
	in := &sd.CreateHttpNamespaceInput{Name: aws.String("idem"), CreatorRequestId: aws.String("req-1")}
	a := must[*sd.CreateHttpNamespaceOutput](t)(c.CreateHttpNamespace(ctx, in))
	b := must[*sd.CreateHttpNamespaceOutput](t)(c.CreateHttpNamespace(ctx, in))
	if aws.ToString(a.OperationId) != aws.ToString(b.OperationId) {
		t.Errorf("a retried create got operation %s, then %s", aws.ToString(a.OperationId), aws.ToString(b.OperationId))
	}
	nsID := opDone(t, c, a.OperationId)["NAMESPACE"]
	_, err := c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String("idem"), CreatorRequestId: aws.String("req-2")})
	wantErr(t, err, "NamespaceAlreadyExists")

	sin := &sd.CreateServiceInput{Name: aws.String("svc"), NamespaceId: aws.String(nsID), CreatorRequestId: aws.String("req-3")}
	s1 := must[*sd.CreateServiceOutput](t)(c.CreateService(ctx, sin)).Service
	s2 := must[*sd.CreateServiceOutput](t)(c.CreateService(ctx, sin)).Service
	if aws.ToString(s1.Id) != aws.ToString(s2.Id) {
		t.Errorf("a retried CreateService made %s and %s", aws.ToString(s1.Id), aws.ToString(s2.Id))
	}
	rin := &sd.RegisterInstanceInput{ServiceId: s1.Id, InstanceId: aws.String("i"), CreatorRequestId: aws.String("req-4"), Attributes: map[string]string{"A": "1"}}
	r1 := must[*sd.RegisterInstanceOutput](t)(c.RegisterInstance(ctx, rin))
	r2 := must[*sd.RegisterInstanceOutput](t)(c.RegisterInstance(ctx, rin))
	if aws.ToString(r1.OperationId) != aws.ToString(r2.OperationId) {
		t.Errorf("a retried RegisterInstance got two operations")
	}
}

// The emulator answers a data- Host header, and a plain SDK client (host
// prefix left on) is what fails against a custom endpoint: the reason the
// project's client helper exists.
func TestDataHostPrefix(t *testing.T) {
	ctx := context.Background()
	_, c, url := emulator(t, cloudmaplocal.Options{}, cloudmapclient.Options{})
	httpService(t, c, "prefix", "web")

	body := []byte(`{"NamespaceName":"prefix","ServiceName":"web"}`)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Host = "data-" + strings.TrimPrefix(url, "http://")
	req.Header.Set("X-Amz-Target", "Route53AutoNaming_v20170314.DiscoverInstancesRevision")
	req.Header.Set("Content-Type", "application/x-amz-json-1.1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != 200 || out["InstancesRevision"] == nil {
		t.Errorf("data- host: %d %v", resp.StatusCode, out)
	}

	plain := sd.New(sd.Options{Region: "us-east-1", BaseEndpoint: aws.String(url),
		Credentials: credentials.NewStaticCredentialsProvider("a", "b", ""), RetryMaxAttempts: 1})
	if _, err := plain.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{NamespaceName: aws.String("prefix"), ServiceName: aws.String("web")}); err == nil || !strings.Contains(err.Error(), "data-127.0.0.1") {
		t.Errorf("a client without the helper should try data-127.0.0.1, got %v", err)
	}
	if _, err := c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{NamespaceName: aws.String("prefix"), ServiceName: aws.String("web")}); err != nil {
		t.Errorf("the helper's client: %v", err)
	}
}

// With credentials configured, SigV4 signatures are checked.
func TestSignatureChecking(t *testing.T) {
	ctx := context.Background()
	srv, err := cloudmaplocal.New(cloudmaplocal.Options{Credentials: map[string]string{"AKIDEXAMPLE": "right-secret"}, Profile: cloudmaptest.Instant().Profile})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	api := httptest.NewServer(srv.Handler())
	defer api.Close()
	client := func(secret string) *sd.Client {
		cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"),
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", secret, "")))
		if err != nil {
			t.Fatal(err)
		}
		return cloudmapclient.NewFromConfig(cfg, cloudmapclient.Options{Endpoint: api.URL, MaxAttempts: 1})
	}
	if _, err := client("right-secret").ListNamespaces(ctx, &sd.ListNamespacesInput{}); err != nil {
		t.Errorf("a correctly signed request: %v", err)
	}
	_, err = client("wrong-secret").ListNamespaces(ctx, &sd.ListNamespacesInput{})
	wantErr(t, err, "InvalidSignatureException")
	status, body := post(t, api.URL, "ListNamespaces", map[string]any{})
	if status != 403 || body["__type"] != "MissingAuthenticationTokenException" {
		t.Errorf("an unsigned request: %d %v", status, body)
	}
}

func TestMetricsCountCalls(t *testing.T) {
	srv, c, _ := emulator(t, cloudmaplocal.Options{}, cloudmapclient.Options{})
	admin := httptest.NewServer(srv.AdminHandler())
	defer admin.Close()
	httpService(t, c, "metrics", "web")
	for i := 0; i < 7; i++ {
		must[*sd.ListNamespacesOutput](t)(c.ListNamespaces(context.Background(), &sd.ListNamespacesInput{}))
	}
	if n := counter(t, admin.URL, "ListNamespaces", "OK"); n != 7 {
		t.Errorf("ListNamespaces counted %d times, want 7", n)
	}
}

// Finished operations past MaxOperations are pruned, oldest first, so
// ListOperations and the snapshot stay bounded; the newest stay readable.
func TestOperationsArePruned(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	_, c, _ := emulator(t, cloudmaplocal.Options{DataDir: dir, MaxOperations: 50}, cloudmapclient.Options{})
	svc := httpService(t, c, "prune", "web")
	var ids []string
	for i := 0; i < 200; i++ {
		out := must[*sd.RegisterInstanceOutput](t)(register(ctx, c, svc, fmt.Sprint("i-", i%10), map[string]string{"AWS_INSTANCE_IPV4": fmt.Sprint("10.1.0.", i%10)}))
		ids = append(ids, aws.ToString(out.OperationId))
	}
	// Newest first, page after page (the namespace's creation aside).
	var listed []string
	p := sd.NewListOperationsPaginator(c, &sd.ListOperationsInput{MaxResults: aws.Int32(7)})
	for p.HasMorePages() {
		for _, op := range must[*sd.ListOperationsOutput](t)(p.NextPage(ctx)).Operations {
			listed = append(listed, aws.ToString(op.Id))
		}
	}
	n := len(listed)
	if n < 50 || n > 55 {
		t.Errorf("ListOperations lists %d operations, want 50 (+ a tenth before a prune)", n)
	}
	newest := slices.Clone(ids[len(ids)-min(n, len(ids)):])
	slices.Reverse(newest)
	if !slices.Equal(listed[:len(newest)], newest) {
		t.Errorf("ListOperations lists %v, want the newest first: %v", listed, newest)
	}
	if _, err := c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String(ids[len(ids)-1])}); err != nil {
		t.Errorf("the newest operation: %v", err)
	}
	var missing *types.OperationNotFound
	if _, err := c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String(ids[0])}); !errors.As(err, &missing) {
		t.Errorf("the oldest operation should be pruned: %v", err)
	}
}

// ListOperations over a full account (the 10,000 finished operations the
// emulator keeps), one page a call: 50 clusters poll it. Sorting every
// operation at each call took 16.8 ms under the region's lock on this
// 2-core machine; the kept order takes 0.63 ms, most of it HTTP.
func BenchmarkListOperationsFull(b *testing.B) {
	ctx := context.Background()
	_, c, _ := emulator(b, cloudmaplocal.Options{}, cloudmapclient.Options{})
	svc := httpService(b, c, "busy", "web")
	for i := 0; i < 10000; i++ {
		must[*sd.RegisterInstanceOutput](b)(register(ctx, c, svc, "i-1", map[string]string{"AWS_INSTANCE_IPV4": "10.1.0.1"}))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		must[*sd.ListOperationsOutput](b)(c.ListOperations(ctx, &sd.ListOperationsInput{}))
	}
}

package cloudmaplocal_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

const (
	ownerAcct    = "111111111111"
	consumerAcct = "222222222222"
	strangerAcct = "333333333333"
)

// accountsEmulator serves three accounts, each with its own access key.
func accountsEmulator(t *testing.T, opts cloudmaplocal.Options) (*cloudmaplocal.Server, string) {
	t.Helper()
	opts.Accounts = map[string]string{"AKIDOWNER": ownerAcct, "AKIDCONSUMER": consumerAcct, "AKIDSTRANGER": strangerAcct}
	if opts.Profile == nil {
		opts.Profile = cloudmaptest.Instant().Profile // the sharing rules, one at a time
	}
	e := cloudmaptest.Start(t, opts)
	return e.Server, e.URL
}

// clientAs is a real SDK client signing with an account's key for a Region.
func clientAs(t *testing.T, url, key, region string) *sd.Client {
	t.Helper()
	c, err := cloudmapclient.New(context.Background(), cloudmapclient.Options{
		Endpoint: url, Region: region, MaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider(key, "secret", ""),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// opOf waits for an operation of a namespace another account may own.
func opOf(t *testing.T, c *sd.Client, id *string, owner string) *types.Operation {
	t.Helper()
	for range 200 {
		out, err := c.GetOperation(context.Background(), &sd.GetOperationInput{OperationId: id, OwnerAccount: aws.String(owner)})
		if err != nil {
			t.Fatal(err)
		}
		if out.Operation.Status == types.OperationStatusSuccess {
			return out.Operation
		}
		if out.Operation.Status == types.OperationStatusFail {
			t.Fatalf("operation %s failed: %s", *id, aws.ToString(out.Operation.ErrorMessage))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("operation %s did not finish", *id)
	return nil
}

// Every rule of a namespace shared between accounts, driven by SDK clients
// of three accounts: the owner, a consumer and an account it is not shared with.
func TestSharedNamespace(t *testing.T) {
	ctx := context.Background()
	srv, url := accountsEmulator(t, cloudmaplocal.Options{})
	owner := clientAs(t, url, "AKIDOWNER", "us-east-1")
	consumer := clientAs(t, url, "AKIDCONSUMER", "us-east-1")
	stranger := clientAs(t, url, "AKIDSTRANGER", "us-east-1")

	created := must[*sd.CreateHttpNamespaceOutput](t)(owner.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{
		Name: aws.String("shared"), Tags: []types.Tag{{Key: aws.String("team"), Value: aws.String("a")}},
	}))
	nsID := opDone(t, owner, created.OperationId)["NAMESPACE"]
	ns := must[*sd.GetNamespaceOutput](t)(owner.GetNamespace(ctx, &sd.GetNamespaceInput{Id: &nsID})).Namespace
	if want := "arn:aws:servicediscovery:us-east-1:" + ownerAcct + ":namespace/" + nsID; aws.ToString(ns.Arn) != want || aws.ToString(ns.ResourceOwner) != ownerAcct {
		t.Fatalf("namespace ARN %s, owner %s; want %s, %s", aws.ToString(ns.Arn), aws.ToString(ns.ResourceOwner), want, ownerAcct)
	}

	// Before the share, the consumer sees nothing.
	_, err := consumer.GetNamespace(ctx, &sd.GetNamespaceInput{Id: ns.Arn})
	wantErr(t, err, "NamespaceNotFound")
	if l := must[*sd.ListNamespacesOutput](t)(consumer.ListNamespaces(ctx, &sd.ListNamespacesInput{})); len(l.Namespaces) != 0 {
		t.Fatalf("the consumer lists %d namespaces before the share", len(l.Namespaces))
	}
	if err := srv.Share(aws.ToString(ns.Arn), consumerAcct); err != nil {
		t.Fatal(err)
	}

	// Listed with its owner; a RESOURCE_OWNER filter tells them apart.
	others := must[*sd.ListNamespacesOutput](t)(consumer.ListNamespaces(ctx, &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{
		{Name: types.NamespaceFilterNameResourceOwner, Values: []string{"OTHER_ACCOUNTS"}, Condition: types.FilterConditionEq},
	}}))
	if len(others.Namespaces) != 1 || aws.ToString(others.Namespaces[0].ResourceOwner) != ownerAcct {
		t.Fatalf("OTHER_ACCOUNTS lists %+v", others.Namespaces)
	}
	if l := must[*sd.ListNamespacesOutput](t)(consumer.ListNamespaces(ctx, &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{
		{Name: types.NamespaceFilterNameResourceOwner, Values: []string{"SELF"}},
	}})); len(l.Namespaces) != 0 {
		t.Fatalf("SELF lists another account's namespace")
	}
	// Another account's namespace is named by ARN only.
	_, err = consumer.GetNamespace(ctx, &sd.GetNamespaceInput{Id: &nsID})
	wantErr(t, err, "NamespaceNotFound")
	must[*sd.GetNamespaceOutput](t)(consumer.GetNamespace(ctx, &sd.GetNamespaceInput{Id: ns.Arn}))
	_, err = consumer.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: &nsID})
	wantErr(t, err, "NamespaceNotFound")
	_, err = stranger.GetNamespace(ctx, &sd.GetNamespaceInput{Id: ns.Arn})
	wantErr(t, err, "NamespaceNotFound")

	// No tags in a shared namespace, for anyone.
	_, err = consumer.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: ns.Arn,
		Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
	wantErr(t, err, "InvalidInput")
	_, err = owner.TagResource(ctx, &sd.TagResourceInput{ResourceARN: ns.Arn, Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
	wantErr(t, err, "InvalidInput")

	// A consumer's service: the owner's account in its ARN, the consumer as creator.
	svc := must[*sd.CreateServiceOutput](t)(consumer.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: ns.Arn})).Service
	if !strings.Contains(aws.ToString(svc.Arn), ":"+ownerAcct+":service/") || aws.ToString(svc.ResourceOwner) != ownerAcct || aws.ToString(svc.CreatedByAccount) != consumerAcct {
		t.Fatalf("consumer's service: ARN %s, owner %s, created by %s", aws.ToString(svc.Arn), aws.ToString(svc.ResourceOwner), aws.ToString(svc.CreatedByAccount))
	}
	_, err = owner.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: &nsID})
	var exists *types.ServiceAlreadyExists
	if !errors.As(err, &exists) || aws.ToString(exists.ServiceArn) != aws.ToString(svc.Arn) {
		t.Fatalf("a second web: want ServiceAlreadyExists with the ARN, got %v", err)
	}

	// Instances: the consumer names the service by ARN, and so reads its operation.
	_, err = consumer.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: svc.Id, InstanceId: aws.String("c1"), Attributes: map[string]string{}})
	wantErr(t, err, "ServiceNotFound")
	reg := must[*sd.RegisterInstanceOutput](t)(consumer.RegisterInstance(ctx, &sd.RegisterInstanceInput{
		ServiceId: svc.Arn, InstanceId: aws.String("c1"), Attributes: map[string]string{"AWS_INSTANCE_IPV4": "10.0.0.1"}}))
	_, err = consumer.GetOperation(ctx, &sd.GetOperationInput{OperationId: reg.OperationId})
	wantErr(t, err, "OperationNotFound")
	if op := opOf(t, consumer, reg.OperationId, ownerAcct); aws.ToString(op.OwnerAccount) != ownerAcct {
		t.Fatalf("operation OwnerAccount %q", aws.ToString(op.OwnerAccount))
	}
	_, err = owner.GetOperation(ctx, &sd.GetOperationInput{OperationId: reg.OperationId})
	wantErr(t, err, "OperationNotFound")
	before := must[*sd.DiscoverInstancesRevisionOutput](t)(consumer.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{
		NamespaceName: aws.String("shared"), ServiceName: aws.String("web"), OwnerAccount: aws.String(ownerAcct)})).InstancesRevision
	ownerReg := must[*sd.RegisterInstanceOutput](t)(owner.RegisterInstance(ctx, &sd.RegisterInstanceInput{
		ServiceId: svc.Id, InstanceId: aws.String("o1"), Attributes: map[string]string{"AWS_INSTANCE_IPV4": "10.0.0.2"}}))
	opDone(t, owner, ownerReg.OperationId)

	// ListOperations never shows another account's operations on a shared
	// namespace, nor (strict reading) a consumer's own.
	for who, c := range map[string]*sd.Client{"owner": owner, "consumer": consumer} {
		ops := must[*sd.ListOperationsOutput](t)(c.ListOperations(ctx, &sd.ListOperationsInput{}))
		for _, op := range ops.Operations {
			if aws.ToString(op.Id) == aws.ToString(reg.OperationId) {
				t.Errorf("the %s lists the consumer's registration", who)
			}
		}
		if who == "owner" && len(ops.Operations) != 2 {
			t.Errorf("the owner lists %d operations, want its own 2", len(ops.Operations))
		}
		if who == "consumer" && len(ops.Operations) != 0 {
			t.Errorf("the consumer lists %d operations, want none", len(ops.Operations))
		}
	}

	// Discovery: OwnerAccount or NamespaceNotFound; the revision moves with any account's change.
	_, err = consumer.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("shared"), ServiceName: aws.String("web")})
	wantErr(t, err, "NamespaceNotFound")
	found := must[*sd.DiscoverInstancesOutput](t)(consumer.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String("shared"), ServiceName: aws.String("web"), OwnerAccount: aws.String(ownerAcct)}))
	if got := instanceIDs(found.Instances); got != "c1,o1" {
		t.Fatalf("discovered %s, want c1,o1", got)
	}
	if aws.ToInt64(found.InstancesRevision) == aws.ToInt64(before) {
		t.Errorf("the owner's registration did not change the revision the consumer reads")
	}
	list := must[*sd.ListInstancesOutput](t)(consumer.ListInstances(ctx, &sd.ListInstancesInput{ServiceId: svc.Arn}))
	creators := map[string]string{}
	for _, i := range list.Instances {
		creators[aws.ToString(i.Id)] = aws.ToString(i.CreatedByAccount)
	}
	if aws.ToString(list.ResourceOwner) != ownerAcct || creators["c1"] != consumerAcct || creators["o1"] != ownerAcct {
		t.Fatalf("ListInstances: owner %s, creators %v", aws.ToString(list.ResourceOwner), creators)
	}

	// A consumer changes only what it made; the owner may change anything.
	_, err = consumer.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: svc.Arn, InstanceId: aws.String("o1")})
	wantErr(t, err, "AccessDeniedException")
	_, err = consumer.DeleteNamespace(ctx, &sd.DeleteNamespaceInput{Id: ns.Arn})
	wantErr(t, err, "AccessDeniedException")
	_, err = owner.UpdateService(ctx, &sd.UpdateServiceInput{Id: svc.Id, Service: &types.ServiceChange{Description: aws.String("x")}})
	wantErr(t, err, "InvalidInput") // it holds another account's instances
	_, err = stranger.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("shared"), ServiceName: aws.String("web"), OwnerAccount: aws.String(ownerAcct)})
	wantErr(t, err, "NamespaceNotFound")

	// Unsharing cuts the consumer off and keeps what it made.
	if err := srv.Unshare(aws.ToString(ns.Arn), consumerAcct); err != nil {
		t.Fatal(err)
	}
	_, err = consumer.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("shared"), ServiceName: aws.String("web"), OwnerAccount: aws.String(ownerAcct)})
	wantErr(t, err, "NamespaceNotFound")
	_, err = consumer.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: svc.Arn, InstanceId: aws.String("c1")})
	wantErr(t, err, "ServiceNotFound")
	kept := must[*sd.DiscoverInstancesOutput](t)(owner.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("shared"), ServiceName: aws.String("web")}))
	if got := instanceIDs(kept.Instances); got != "c1,o1" {
		t.Fatalf("after the unshare the owner discovers %s, want c1,o1 (nothing deleted)", got)
	}
	// Tags work again once the namespace is no longer shared.
	must[*sd.TagResourceOutput](t)(owner.TagResource(ctx, &sd.TagResourceInput{ResourceARN: ns.Arn, Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}}))
	// The owner may remove what a consumer made.
	opDone(t, owner, must[*sd.DeregisterInstanceOutput](t)(owner.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: svc.Id, InstanceId: aws.String("c1")})).OperationId)
}

// Regions are separate Cloud Maps: state, ARNs and operations; namespace
// names are unique per account, not across accounts.
func TestRegionsAndAccountsAreSeparate(t *testing.T) {
	ctx := context.Background()
	_, url := accountsEmulator(t, cloudmaplocal.Options{})
	east := clientAs(t, url, "AKIDOWNER", "us-east-1")
	west := clientAs(t, url, "AKIDOWNER", "eu-west-1")
	other := clientAs(t, url, "AKIDCONSUMER", "us-east-1")
	for _, c := range []*sd.Client{east, west, other} {
		out := must[*sd.CreateHttpNamespaceOutput](t)(c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String("same")}))
		opDone(t, c, out.OperationId)
	}
	westNS := must[*sd.ListNamespacesOutput](t)(west.ListNamespaces(ctx, &sd.ListNamespacesInput{})).Namespaces
	if len(westNS) != 1 || !strings.HasPrefix(aws.ToString(westNS[0].Arn), "arn:aws:servicediscovery:eu-west-1:"+ownerAcct+":") {
		t.Fatalf("eu-west-1 lists %+v", westNS)
	}
	if ops := must[*sd.ListOperationsOutput](t)(west.ListOperations(ctx, &sd.ListOperationsInput{})).Operations; len(ops) != 1 {
		t.Fatalf("eu-west-1 lists %d operations, want its one", len(ops))
	}
	_, err := east.GetNamespace(ctx, &sd.GetNamespaceInput{Id: westNS[0].Arn})
	wantErr(t, err, "NamespaceNotFound")
}

// The AWS CLI's request shapes (what botocore sends for
// `aws servicediscovery discover-instances --owner-account ...` and
// `list-namespaces --filters Name=RESOURCE_OWNER,...`), signed as it signs.
func TestCLIRequestShapes(t *testing.T) {
	ctx := context.Background()
	srv, url := accountsEmulator(t, cloudmaplocal.Options{})
	owner := clientAs(t, url, "AKIDOWNER", "us-west-2")
	svcID := httpService(t, owner, "cli", "web")
	nsID := aws.ToString(must[*sd.GetServiceOutput](t)(owner.GetService(ctx, &sd.GetServiceInput{Id: &svcID})).Service.NamespaceId)
	opDone(t, owner, must[*sd.RegisterInstanceOutput](t)(owner.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: &svcID, InstanceId: aws.String("i1"), Attributes: map[string]string{}})).OperationId)
	if err := srv.Share("arn:aws:servicediscovery:us-west-2:"+ownerAcct+":namespace/"+nsID, consumerAcct); err != nil {
		t.Fatal(err)
	}

	call := func(op, body string) (int, map[string]any) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/", bytes.NewReader([]byte(body)))
		req.Header.Set("X-Amz-Target", "Route53AutoNaming_v20170314."+op)
		req.Header.Set("Content-Type", "application/x-amz-json-1.1")
		digest := sha256.Sum256([]byte(body))
		sum := hex.EncodeToString(digest[:])
		req.Header.Set("X-Amz-Content-Sha256", sum)
		creds := aws.Credentials{AccessKeyID: "AKIDCONSUMER", SecretAccessKey: "secret"}
		if err := v4.NewSigner().SignHTTP(ctx, creds, req, sum, "servicediscovery", "us-west-2", time.Now()); err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, out := call("DiscoverInstances", `{"NamespaceName": "cli", "ServiceName": "web", "OwnerAccount": "`+ownerAcct+`"}`)
	if code != 200 || len(out["Instances"].([]any)) != 1 {
		t.Fatalf("discover-instances --owner-account: %d %v", code, out)
	}
	code, out = call("DiscoverInstances", `{"NamespaceName": "cli", "ServiceName": "web"}`)
	if code != 404 || out["__type"] != "NamespaceNotFound" {
		t.Fatalf("discover-instances without --owner-account: %d %v", code, out)
	}
	code, out = call("ListNamespaces", `{"Filters": [{"Name": "RESOURCE_OWNER", "Values": ["OTHER_ACCOUNTS"], "Condition": "EQ"}]}`)
	if code != 200 || len(out["Namespaces"].([]any)) != 1 {
		t.Fatalf("list-namespaces --filters Name=RESOURCE_OWNER: %d %v", code, out)
	}
	code, out = call("DiscoverInstances", `{"NamespaceName": "cli", "ServiceName": "web", "OwnerAccount": "12345"}`)
	if code != 400 || out["__type"] != "InvalidInput" {
		t.Fatalf("an OwnerAccount of 5 digits: %d %v, want InvalidInput (the model's 12 characters)", code, out)
	}
}

// A snapshot keeps every Region, owner and share; one written before
// Regions and accounts existed loads as the default Region's and account's.
func TestSnapshotKeepsRegionsAndShares(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	srv, url := accountsEmulator(t, cloudmaplocal.Options{DataDir: dir})
	owner := clientAs(t, url, "AKIDOWNER", "ap-south-1")
	nsID := opDone(t, owner, must[*sd.CreateHttpNamespaceOutput](t)(owner.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String("kept")})).OperationId)["NAMESPACE"]
	arn := "arn:aws:servicediscovery:ap-south-1:" + ownerAcct + ":namespace/" + nsID
	if err := srv.Share(arn, consumerAcct); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	again, url2 := accountsEmulator(t, cloudmaplocal.Options{DataDir: dir})
	if got := again.Shares()[arn]; len(got) != 1 || got[0] != consumerAcct {
		t.Fatalf("shares after a restart: %v", again.Shares())
	}
	must[*sd.GetNamespaceOutput](t)(clientAs(t, url2, "AKIDCONSUMER", "ap-south-1").GetNamespace(ctx, &sd.GetNamespaceInput{Id: &arn}))

	old := t.TempDir()
	snap := `{"Namespaces":{"ns-old":{"Id":"ns-old","Arn":"arn:aws:servicediscovery:us-east-1:123456789012:namespace/ns-old","Name":"old","Type":"HTTP","HttpName":"old","CreateDate":"2026-01-01T00:00:00Z"}},"Services":{},"Operations":{},"Tags":{},"Creators":{}}`
	if err := os.WriteFile(filepath.Join(old, "cloudmap-state.json"), []byte(snap), 0o644); err != nil {
		t.Fatal(err)
	}
	_, c, _ := emulator(t, cloudmaplocal.Options{DataDir: old}, cloudmapclient.Options{})
	got := must[*sd.GetNamespaceOutput](t)(c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String("ns-old")})).Namespace
	if aws.ToString(got.ResourceOwner) != "123456789012" {
		t.Fatalf("an old snapshot's namespace is owned by %q", aws.ToString(got.ResourceOwner))
	}
}

// The request quotas are each account's in each Region.
func TestRateLimitsPerAccountAndRegion(t *testing.T) {
	ctx := context.Background()
	_, url := accountsEmulator(t, cloudmaplocal.Options{Faults: cloudmaplocal.Faults{
		RateLimits: map[string]cloudmaplocal.RateLimit{"ListNamespaces": {Rate: 0.001, Burst: 1}},
	}})
	for _, c := range []*sd.Client{
		clientAs(t, url, "AKIDOWNER", "us-east-1"), clientAs(t, url, "AKIDCONSUMER", "us-east-1"), clientAs(t, url, "AKIDOWNER", "eu-west-1"),
	} {
		must[*sd.ListNamespacesOutput](t)(c.ListNamespaces(ctx, &sd.ListNamespacesInput{}))
	}
	_, err := clientAs(t, url, "AKIDOWNER", "us-east-1").ListNamespaces(ctx, &sd.ListNamespacesInput{})
	wantErr(t, err, "RequestLimitExceeded")
}

// Faults can hit one Region alone.
func TestFaultsInOneRegion(t *testing.T) {
	ctx := context.Background()
	_, url := accountsEmulator(t, cloudmaplocal.Options{Faults: cloudmaplocal.Faults{Outage: true, Regions: []string{"eu-west-1"}}})
	must[*sd.ListNamespacesOutput](t)(clientAs(t, url, "AKIDOWNER", "us-east-1").ListNamespaces(ctx, &sd.ListNamespacesInput{}))
	_, err := clientAs(t, url, "AKIDOWNER", "eu-west-1").ListNamespaces(ctx, &sd.ListNamespacesInput{})
	wantErr(t, err, "ServiceUnavailable")
}

package cloudmaplocal_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/aws/smithy-go"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
)

// emulator starts a server on loopback and a real SDK client for it.
// emulator starts one for a test of one of its behaviours: instant unless
// the test names a profile (the aws profile's parts are tested apart, in
// profile_test.go).
func emulator(t testing.TB, opts cloudmaplocal.Options, co cloudmapclient.Options) (*cloudmaplocal.Server, *sd.Client, string) {
	t.Helper()
	if opts.Profile == nil {
		opts.Profile = cloudmaptest.Instant().Profile
	}
	e := cloudmaptest.Start(t, opts)
	return e.Server, e.Client(t, co), e.URL
}

// wantErr asserts err is the model error code.
func wantErr(t *testing.T, err error, code string) {
	t.Helper()
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("want %s, got %v", code, err)
	}
	if ae.ErrorCode() != code {
		t.Fatalf("want %s, got %s: %s", code, ae.ErrorCode(), ae.ErrorMessage())
	}
}

func must[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// opDone waits for an operation to succeed and returns its targets.
func opDone(t testing.TB, c *sd.Client, id *string) map[string]string {
	t.Helper()
	for i := 0; i < 200; i++ {
		out, err := c.GetOperation(context.Background(), &sd.GetOperationInput{OperationId: id})
		if err != nil {
			t.Fatal(err)
		}
		switch out.Operation.Status {
		case types.OperationStatusSuccess:
			return out.Operation.Targets
		case types.OperationStatusFail:
			t.Fatalf("operation %s failed: %s %s", *id, aws.ToString(out.Operation.ErrorCode), aws.ToString(out.Operation.ErrorMessage))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("operation %s did not finish", *id)
	return nil
}

// TestEveryOperation walks all 30 operations of the model through the
// real SDK client, with the error cases of each.
func TestEveryOperation(t *testing.T) {
	ctx := context.Background()
	_, c, _ := emulator(t, cloudmaplocal.Options{}, cloudmapclient.Options{})

	// Namespaces of the three kinds.
	httpOp := must[*sd.CreateHttpNamespaceOutput](t)(c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{
		Name: aws.String("team-a"), Description: aws.String("http"), Tags: []types.Tag{{Key: aws.String("owner"), Value: aws.String("a")}},
	}))
	httpNS := opDone(t, c, httpOp.OperationId)["NAMESPACE"]
	privOp := must[*sd.CreatePrivateDnsNamespaceOutput](t)(c.CreatePrivateDnsNamespace(ctx, &sd.CreatePrivateDnsNamespaceInput{
		Name: aws.String("corp.internal"), Vpc: aws.String("vpc-123"),
	}))
	privNS := opDone(t, c, privOp.OperationId)["NAMESPACE"]
	pubOp := must[*sd.CreatePublicDnsNamespaceOutput](t)(c.CreatePublicDnsNamespace(ctx, &sd.CreatePublicDnsNamespaceInput{
		Name:       aws.String("example.com"),
		Properties: &types.PublicDnsNamespaceProperties{DnsProperties: &types.PublicDnsPropertiesMutable{SOA: &types.SOA{TTL: aws.Int64(120)}}},
	}))
	pubNS := opDone(t, c, pubOp.OperationId)["NAMESPACE"]
	_, err := c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String("team-a")})
	wantErr(t, err, "NamespaceAlreadyExists")
	_, err = c.CreatePublicDnsNamespace(ctx, &sd.CreatePublicDnsNamespaceInput{Name: aws.String("not a domain")})
	wantErr(t, err, "InvalidInput")

	ns := must[*sd.GetNamespaceOutput](t)(c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(pubNS)})).Namespace
	if ns.Type != types.NamespaceTypeDnsPublic || aws.ToInt64(ns.Properties.DnsProperties.SOA.TTL) != 120 || ns.Properties.DnsProperties.HostedZoneId == nil ||
		aws.ToString(ns.Properties.HttpProperties.HttpName) != "example.com" || !strings.HasSuffix(aws.ToString(ns.Arn), ":namespace/"+pubNS) || ns.CreateDate == nil {
		t.Errorf("GetNamespace: %+v", ns)
	}
	_, err = c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String("ns-doesnotexist0000")})
	wantErr(t, err, "NamespaceNotFound")

	list := must[*sd.ListNamespacesOutput](t)(c.ListNamespaces(ctx, &sd.ListNamespacesInput{
		Filters: []types.NamespaceFilter{{Name: types.NamespaceFilterNameType, Values: []string{"DNS_PRIVATE"}}},
	}))
	if len(list.Namespaces) != 1 || aws.ToString(list.Namespaces[0].Id) != privNS {
		t.Errorf("ListNamespaces TYPE=DNS_PRIVATE: %+v", list.Namespaces)
	}
	list = must[*sd.ListNamespacesOutput](t)(c.ListNamespaces(ctx, &sd.ListNamespacesInput{
		Filters: []types.NamespaceFilter{{Name: types.NamespaceFilterNameName, Condition: types.FilterConditionBeginsWith, Values: []string{"team"}}},
	}))
	if len(list.Namespaces) != 1 || aws.ToString(list.Namespaces[0].Id) != httpNS {
		t.Errorf("ListNamespaces NAME BEGINS_WITH team: %+v", list.Namespaces)
	}
	_, err = c.ListNamespaces(ctx, &sd.ListNamespacesInput{
		Filters: []types.NamespaceFilter{{Name: types.NamespaceFilterNameName, Condition: types.FilterConditionBetween, Values: []string{"a", "b"}}},
	})
	wantErr(t, err, "InvalidInput")

	opDone(t, c, must[*sd.UpdateHttpNamespaceOutput](t)(c.UpdateHttpNamespace(ctx, &sd.UpdateHttpNamespaceInput{
		Id: aws.String(httpNS), Namespace: &types.HttpNamespaceChange{Description: aws.String("changed")},
	})).OperationId)
	opDone(t, c, must[*sd.UpdatePrivateDnsNamespaceOutput](t)(c.UpdatePrivateDnsNamespace(ctx, &sd.UpdatePrivateDnsNamespaceInput{
		Id: aws.String(privNS), Namespace: &types.PrivateDnsNamespaceChange{Properties: &types.PrivateDnsNamespacePropertiesChange{
			DnsProperties: &types.PrivateDnsPropertiesMutableChange{SOA: &types.SOAChange{TTL: aws.Int64(60)}}}},
	})).OperationId)
	opDone(t, c, must[*sd.UpdatePublicDnsNamespaceOutput](t)(c.UpdatePublicDnsNamespace(ctx, &sd.UpdatePublicDnsNamespaceInput{
		Id: aws.String(pubNS), Namespace: &types.PublicDnsNamespaceChange{Description: aws.String("public")},
	})).OperationId)
	_, err = c.UpdateHttpNamespace(ctx, &sd.UpdateHttpNamespaceInput{Id: aws.String(privNS), Namespace: &types.HttpNamespaceChange{Description: aws.String("x")}})
	wantErr(t, err, "InvalidInput")
	if d := aws.ToString(must[*sd.GetNamespaceOutput](t)(c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(httpNS)})).Namespace.Description); d != "changed" {
		t.Errorf("UpdateHttpNamespace: description %q", d)
	}
	priv := must[*sd.GetNamespaceOutput](t)(c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(privNS)})).Namespace
	if aws.ToInt64(priv.Properties.DnsProperties.SOA.TTL) != 60 {
		t.Errorf("UpdatePrivateDnsNamespace: SOA TTL %d", aws.ToInt64(priv.Properties.DnsProperties.SOA.TTL))
	}

	// Services.
	httpSvc := must[*sd.CreateServiceOutput](t)(c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: aws.String(httpNS)})).Service
	if httpSvc.Type != types.ServiceTypeHttp || aws.ToInt32(httpSvc.InstanceCount) != 0 {
		t.Errorf("CreateService in HTTP namespace: %+v", httpSvc)
	}
	dnsSvc := must[*sd.CreateServiceOutput](t)(c.CreateService(ctx, &sd.CreateServiceInput{
		Name: aws.String("api"), NamespaceId: aws.String(privNS),
		DnsConfig: &types.DnsConfig{RoutingPolicy: types.RoutingPolicyMultivalue, DnsRecords: []types.DnsRecord{
			{Type: types.RecordTypeA, TTL: aws.Int64(10)}, {Type: types.RecordTypeSrv, TTL: aws.Int64(10)}}},
		HealthCheckCustomConfig: &types.HealthCheckCustomConfig{},
	})).Service
	_, err = c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("web"), NamespaceId: aws.String(httpNS)})
	wantErr(t, err, "ServiceAlreadyExists")
	_, err = c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("x"), NamespaceId: aws.String("ns-missing00000000")})
	wantErr(t, err, "NamespaceNotFound")
	_, err = c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("nodns"), NamespaceId: aws.String(privNS)})
	wantErr(t, err, "InvalidInput")
	got := must[*sd.GetServiceOutput](t)(c.GetService(ctx, &sd.GetServiceInput{Id: dnsSvc.Id})).Service
	if got.Type != types.ServiceTypeDnsHttp || len(got.DnsConfig.DnsRecords) != 2 || aws.ToString(got.NamespaceId) != privNS {
		t.Errorf("GetService: %+v", got)
	}
	_, err = c.GetService(ctx, &sd.GetServiceInput{Id: aws.String("srv-missing0000000")})
	wantErr(t, err, "ServiceNotFound")
	svcs := must[*sd.ListServicesOutput](t)(c.ListServices(ctx, &sd.ListServicesInput{
		Filters: []types.ServiceFilter{{Name: types.ServiceFilterNameNamespaceId, Values: []string{httpNS}}},
	})).Services
	if len(svcs) != 1 || aws.ToString(svcs[0].Name) != "web" {
		t.Errorf("ListServices NAMESPACE_ID: %+v", svcs)
	}
	opDone(t, c, must[*sd.UpdateServiceOutput](t)(c.UpdateService(ctx, &sd.UpdateServiceInput{Id: dnsSvc.Id, Service: &types.ServiceChange{
		DnsConfig: &types.DnsConfigChange{DnsRecords: []types.DnsRecord{{Type: types.RecordTypeA, TTL: aws.Int64(30)}, {Type: types.RecordTypeSrv, TTL: aws.Int64(30)}}},
	}})).OperationId)
	if ttl := aws.ToInt64(must[*sd.GetServiceOutput](t)(c.GetService(ctx, &sd.GetServiceInput{Id: dnsSvc.Id})).Service.DnsConfig.DnsRecords[0].TTL); ttl != 30 {
		t.Errorf("UpdateService: TTL %d", ttl)
	}
	_, err = c.UpdateService(ctx, &sd.UpdateServiceInput{Id: aws.String("srv-missing0000000"), Service: &types.ServiceChange{Description: aws.String("x")}})
	wantErr(t, err, "ServiceNotFound")

	// Service attributes.
	must[*sd.UpdateServiceAttributesOutput](t)(c.UpdateServiceAttributes(ctx, &sd.UpdateServiceAttributesInput{ServiceId: httpSvc.Id, Attributes: map[string]string{"a": "1", "b": "2"}}))
	must[*sd.DeleteServiceAttributesOutput](t)(c.DeleteServiceAttributes(ctx, &sd.DeleteServiceAttributesInput{ServiceId: httpSvc.Id, Attributes: []string{"a"}}))
	sa := must[*sd.GetServiceAttributesOutput](t)(c.GetServiceAttributes(ctx, &sd.GetServiceAttributesInput{ServiceId: httpSvc.Id})).ServiceAttributes
	if len(sa.Attributes) != 1 || sa.Attributes["b"] != "2" || aws.ToString(sa.ServiceArn) != aws.ToString(httpSvc.Arn) {
		t.Errorf("service attributes: %+v", sa)
	}
	many := map[string]string{}
	for i := 0; i < 30; i++ {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	_, err = c.UpdateServiceAttributes(ctx, &sd.UpdateServiceAttributesInput{ServiceId: httpSvc.Id, Attributes: many})
	wantErr(t, err, "ServiceAttributesLimitExceededException")

	// Tags.
	nsArn := must[*sd.GetNamespaceOutput](t)(c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(httpNS)})).Namespace.Arn
	must[*sd.TagResourceOutput](t)(c.TagResource(ctx, &sd.TagResourceInput{ResourceARN: nsArn, Tags: []types.Tag{{Key: aws.String("env"), Value: aws.String("dev")}, {Key: aws.String("owner"), Value: aws.String("b")}}}))
	must[*sd.UntagResourceOutput](t)(c.UntagResource(ctx, &sd.UntagResourceInput{ResourceARN: nsArn, TagKeys: []string{"env"}}))
	tags := must[*sd.ListTagsForResourceOutput](t)(c.ListTagsForResource(ctx, &sd.ListTagsForResourceInput{ResourceARN: nsArn})).Tags
	if len(tags) != 1 || aws.ToString(tags[0].Key) != "owner" || aws.ToString(tags[0].Value) != "b" {
		t.Errorf("tags: %+v", tags)
	}
	_, err = c.ListTagsForResource(ctx, &sd.ListTagsForResourceInput{ResourceARN: aws.String("arn:aws:servicediscovery:us-east-1:123456789012:namespace/ns-gone")})
	wantErr(t, err, "ResourceNotFoundException")
	var tooMany []types.Tag
	for i := 0; i < 51; i++ {
		tooMany = append(tooMany, types.Tag{Key: aws.String(fmt.Sprint("t", i)), Value: aws.String("v")})
	}
	_, err = c.TagResource(ctx, &sd.TagResourceInput{ResourceARN: nsArn, Tags: tooMany})
	wantErr(t, err, "TooManyTagsException")

	// Instances, listing and discovery.
	rev0 := aws.ToInt64(must[*sd.DiscoverInstancesRevisionOutput](t)(c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{NamespaceName: aws.String("team-a"), ServiceName: aws.String("web")})).InstancesRevision)
	for i, zone := range []string{"a", "a", "b"} {
		opDone(t, c, must[*sd.RegisterInstanceOutput](t)(c.RegisterInstance(ctx, &sd.RegisterInstanceInput{
			ServiceId: httpSvc.Id, InstanceId: aws.String(fmt.Sprintf("i-%d", i)),
			Attributes: map[string]string{"AWS_INSTANCE_IPV4": fmt.Sprintf("10.0.0.%d", i), "ZONE": zone, "N": strconv.Itoa(i)},
		})).OperationId)
	}
	rev1 := aws.ToInt64(must[*sd.DiscoverInstancesRevisionOutput](t)(c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{NamespaceName: aws.String("team-a"), ServiceName: aws.String("web")})).InstancesRevision)
	if rev1 != rev0+3 {
		t.Errorf("revision %d after 3 registrations from %d", rev1, rev0)
	}
	page1 := must[*sd.ListInstancesOutput](t)(c.ListInstances(ctx, &sd.ListInstancesInput{ServiceId: httpSvc.Id, MaxResults: aws.Int32(2)}))
	page2 := must[*sd.ListInstancesOutput](t)(c.ListInstances(ctx, &sd.ListInstancesInput{ServiceId: httpSvc.Id, MaxResults: aws.Int32(2), NextToken: page1.NextToken}))
	if len(page1.Instances) != 2 || page1.NextToken == nil || len(page2.Instances) != 1 || page2.NextToken != nil || aws.ToString(page2.Instances[0].Id) != "i-2" {
		t.Errorf("ListInstances pages: %+v / %+v", page1, page2)
	}
	inst := must[*sd.GetInstanceOutput](t)(c.GetInstance(ctx, &sd.GetInstanceInput{ServiceId: httpSvc.Id, InstanceId: aws.String("i-1")})).Instance
	if inst.Attributes["ZONE"] != "a" || aws.ToString(inst.CreatorRequestId) == "" {
		t.Errorf("GetInstance: %+v", inst)
	}
	_, err = c.GetInstance(ctx, &sd.GetInstanceInput{ServiceId: httpSvc.Id, InstanceId: aws.String("i-9")})
	wantErr(t, err, "InstanceNotFound")
	disc := must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String("team-a"), ServiceName: aws.String("web"), QueryParameters: map[string]string{"ZONE": "a"},
	}))
	if ids := instanceIDs(disc.Instances); ids != "i-0,i-1" || aws.ToInt64(disc.InstancesRevision) != rev1 {
		t.Errorf("DiscoverInstances ZONE=a: %s rev %d", ids, aws.ToInt64(disc.InstancesRevision))
	}
	disc = must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String("team-a"), ServiceName: aws.String("web"), QueryParameters: map[string]string{"ZONE": "a"}, OptionalParameters: map[string]string{"N": "1"},
	}))
	if ids := instanceIDs(disc.Instances); ids != "i-1" {
		t.Errorf("DiscoverInstances with matching OptionalParameters: %s", ids)
	}
	disc = must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String("team-a"), ServiceName: aws.String("web"), OptionalParameters: map[string]string{"N": "7"}, MaxResults: aws.Int32(2),
	}))
	if ids := instanceIDs(disc.Instances); ids != "i-0,i-1" {
		t.Errorf("DiscoverInstances with unmatched OptionalParameters and MaxResults 2: %s", ids)
	}
	_, err = c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("nope"), ServiceName: aws.String("web")})
	wantErr(t, err, "NamespaceNotFound")
	_, err = c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("team-a"), ServiceName: aws.String("nope")})
	wantErr(t, err, "ServiceNotFound")

	// DNS records need their attributes; custom health drives discovery.
	_, err = c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: dnsSvc.Id, InstanceId: aws.String("x"), Attributes: map[string]string{"AWS_INSTANCE_PORT": "80"}})
	wantErr(t, err, "InvalidInput")
	for i := 0; i < 2; i++ {
		opDone(t, c, must[*sd.RegisterInstanceOutput](t)(c.RegisterInstance(ctx, &sd.RegisterInstanceInput{
			ServiceId: dnsSvc.Id, InstanceId: aws.String(fmt.Sprint("task-", i)),
			Attributes: map[string]string{"AWS_INSTANCE_IPV4": fmt.Sprint("192.168.0.", i), "AWS_INSTANCE_PORT": "8080"},
		})).OperationId)
	}
	must[*sd.UpdateInstanceCustomHealthStatusOutput](t)(c.UpdateInstanceCustomHealthStatus(ctx, &sd.UpdateInstanceCustomHealthStatusInput{
		ServiceId: dnsSvc.Id, InstanceId: aws.String("task-0"), Status: types.CustomHealthStatusUnhealthy,
	}))
	_, err = c.UpdateInstanceCustomHealthStatus(ctx, &sd.UpdateInstanceCustomHealthStatusInput{ServiceId: httpSvc.Id, InstanceId: aws.String("i-0"), Status: types.CustomHealthStatusUnhealthy})
	wantErr(t, err, "CustomHealthNotFound")
	for status, want := range map[types.HealthStatusFilter]string{
		types.HealthStatusFilterHealthy: "task-1", types.HealthStatusFilterUnhealthy: "task-0", types.HealthStatusFilterAll: "task-0,task-1",
	} {
		disc := must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("corp.internal"), ServiceName: aws.String("api"), HealthStatus: status}))
		if ids := instanceIDs(disc.Instances); ids != want {
			t.Errorf("DiscoverInstances %s: %s, want %s", status, ids, want)
		}
	}
	must[*sd.UpdateInstanceCustomHealthStatusOutput](t)(c.UpdateInstanceCustomHealthStatus(ctx, &sd.UpdateInstanceCustomHealthStatusInput{
		ServiceId: dnsSvc.Id, InstanceId: aws.String("task-1"), Status: types.CustomHealthStatusUnhealthy,
	}))
	disc = must[*sd.DiscoverInstancesOutput](t)(c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String("corp.internal"), ServiceName: aws.String("api"), HealthStatus: types.HealthStatusFilterHealthyOrElseAll}))
	if ids := instanceIDs(disc.Instances); ids != "task-0,task-1" {
		t.Errorf("DiscoverInstances HEALTHY_OR_ELSE_ALL with none healthy: %s", ids)
	}
	health := must[*sd.GetInstancesHealthStatusOutput](t)(c.GetInstancesHealthStatus(ctx, &sd.GetInstancesHealthStatusInput{ServiceId: dnsSvc.Id}))
	if health.Status["task-0"] != types.HealthStatusUnhealthy || len(health.Status) != 2 {
		t.Errorf("GetInstancesHealthStatus: %+v", health.Status)
	}
	_, err = c.GetInstancesHealthStatus(ctx, &sd.GetInstancesHealthStatusInput{ServiceId: dnsSvc.Id, Instances: []string{"nope"}})
	wantErr(t, err, "InstanceNotFound")

	// Operations: the change feed.
	since := time.Now().Add(-time.Minute)
	ops := must[*sd.ListOperationsOutput](t)(c.ListOperations(ctx, &sd.ListOperationsInput{Filters: []types.OperationFilter{
		{Name: types.OperationFilterNameType, Values: []string{"REGISTER_INSTANCE"}},
		{Name: types.OperationFilterNameServiceId, Values: []string{aws.ToString(httpSvc.Id)}},
		{Name: types.OperationFilterNameUpdateDate, Condition: types.FilterConditionBetween, Values: []string{fmt.Sprint(since.Unix()), fmt.Sprint(time.Now().Add(time.Minute).Unix())}},
	}}))
	if len(ops.Operations) != 3 {
		t.Errorf("ListOperations REGISTER_INSTANCE on %s: %d operations", aws.ToString(httpSvc.Id), len(ops.Operations))
	}
	_, err = c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String("nope")})
	wantErr(t, err, "OperationNotFound")

	// Deletion order: instances, services, namespaces.
	_, err = c.DeleteService(ctx, &sd.DeleteServiceInput{Id: httpSvc.Id})
	wantErr(t, err, "ResourceInUse")
	_, err = c.DeleteNamespace(ctx, &sd.DeleteNamespaceInput{Id: aws.String(httpNS)})
	wantErr(t, err, "ResourceInUse")
	for _, id := range []string{"i-0", "i-1", "i-2"} {
		opDone(t, c, must[*sd.DeregisterInstanceOutput](t)(c.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: httpSvc.Id, InstanceId: aws.String(id)})).OperationId)
	}
	_, err = c.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: httpSvc.Id, InstanceId: aws.String("i-0")})
	wantErr(t, err, "InstanceNotFound")
	must[*sd.DeleteServiceOutput](t)(c.DeleteService(ctx, &sd.DeleteServiceInput{Id: httpSvc.Id}))
	opDone(t, c, must[*sd.DeleteNamespaceOutput](t)(c.DeleteNamespace(ctx, &sd.DeleteNamespaceInput{Id: aws.String(httpNS)})).OperationId)
	_, err = c.GetNamespace(ctx, &sd.GetNamespaceInput{Id: aws.String(httpNS)})
	wantErr(t, err, "NamespaceNotFound")
}

func instanceIDs(l []types.HttpInstanceSummary) string {
	var ids []string
	for _, i := range l {
		ids = append(ids, aws.ToString(i.InstanceId))
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

package cloudmapdns

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
)

// What this mode creates carries clustermap's mark (what the IAM policy
// lets it create) and the name of its creator, and only what names a
// creator is ever deleted: a service ECS or a person made stays.
func TestCreatedServicesCarryTheMark(t *testing.T) {
	ctx := context.Background()
	newClient, nsID := emulator(t, "mark.local")
	c := newClient()
	m := CloudMap{c}
	ns := Namespace{ID: nsID, Type: types.NamespaceTypeDnsPrivate}

	created, err := m.EnsureService(ctx, ns, "web", "cluster-1/default/web", DNSSettings{TTL: 10, Family: "A"})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := m.CreateLock(ctx, nsID, "lock-web", "cluster-1/default/web")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{created, lock} {
		got, err := c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(id)})
		if err != nil {
			t.Fatal(err)
		}
		tags, err := cloudmapclient.Tags(ctx, c, got.Service.Arn)
		if err != nil {
			t.Fatal(err)
		}
		if !cloudmapclient.IsMarked(tags) || tags[TagCreatedBy] != "cluster-1/default/web" {
			t.Errorf("service %s tags %v: want %s=%s and %s", aws.ToString(got.Service.Name), tags, cloudmapclient.TagManagedBy, cloudmapclient.ManagedBy, TagCreatedBy)
		}
	}

	ecs, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String("ecs-task"), NamespaceId: aws.String(nsID),
		DnsConfig: &types.DnsConfig{DnsRecords: []types.DnsRecord{{Type: types.RecordTypeA, TTL: aws.Int64(10)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteIfCreated(ctx, Service{ID: aws.ToString(ecs.Service.Id), ARN: aws.ToString(ecs.Service.Arn)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetService(ctx, &sd.GetServiceInput{Id: ecs.Service.Id}); err != nil {
		t.Errorf("a service clustermap did not create was deleted: %v", err)
	}
	got, err := c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(created)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteIfCreated(ctx, Service{ID: created, ARN: aws.ToString(got.Service.Arn)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetService(ctx, &sd.GetServiceInput{Id: aws.String(created)}); !cloudmapclient.IsNotFound(err) {
		t.Errorf("the service clustermap created is still there (%v)", err)
	}
}

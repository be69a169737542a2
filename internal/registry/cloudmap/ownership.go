package cloudmap

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
)

// ownership is how clustermap marks the services it creates and tells
// them apart later: only what it created for this clusterset is deleted.
// Chosen once, in New.
type ownership interface {
	// mark marks a service about to be created.
	mark(in *sd.CreateServiceInput)
	// createdService tells whether clustermap created a service for this
	// clusterset.
	createdService(ctx context.Context, svc *types.Service) (bool, error)
	// deletesNamespaces tells whether an empty namespace clustermap created
	// is deleted with its last service; createdNamespace whether it did.
	deletesNamespaces() bool
	createdNamespace(ctx context.Context, arn *string) (bool, error)
}

// tagged is ownership in one account: clustermap's tags, with the
// clusterset's, on namespaces and services.
type tagged struct {
	c          *sd.Client
	clusterSet string
}

func (t tagged) tags() []types.Tag {
	return cloudmapclient.Marked(types.Tag{Key: aws.String(TagClusterSet), Value: aws.String(t.clusterSet)})
}

func (t tagged) mark(in *sd.CreateServiceInput) { in.Tags = t.tags() }

func (t tagged) createdService(ctx context.Context, svc *types.Service) (bool, error) {
	return t.createdNamespace(ctx, svc.Arn)
}

// createdNamespace reads the tags of a namespace, or of a service.
func (t tagged) createdNamespace(ctx context.Context, arn *string) (bool, error) {
	tags, err := cloudmapclient.Tags(ctx, t.c, arn)
	if err != nil {
		return false, err
	}
	return cloudmapclient.IsMarked(tags) && tags[TagClusterSet] == t.clusterSet, nil
}

func (tagged) deletesNamespaces() bool { return true }

// requested is ownership in a namespace shared across accounts, where
// nothing takes tags: the creating account and the CreatorRequestId
// clustermap sets (tenancy.go). The namespace is the owner's to delete,
// and sits in a RAM share: clustermap leaves it.
type requested struct {
	account, token string
}

func (r requested) mark(in *sd.CreateServiceInput) { in.CreatorRequestId = aws.String(r.token) }

func (r requested) createdService(_ context.Context, svc *types.Service) (bool, error) {
	return aws.ToString(svc.CreatedByAccount) == r.account && aws.ToString(svc.CreatorRequestId) == r.token, nil
}

func (requested) deletesNamespaces() bool { return false }

func (requested) createdNamespace(context.Context, *string) (bool, error) { return false, nil }

package cloudmapclient

import (
	"context"
	"errors"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/aws/smithy-go"
	"golang.org/x/sync/errgroup"
)

// What both Cloud Map modes (MCS records, DNS registrations) need beyond
// the SDK: bounded fan-out, one reading of "not found", namespace lookup
// by name, and one mark on what clustermap creates.

// The mark on every namespace and service clustermap creates, in every
// mode; the IAM policies allow creating and deleting only what carries it.
// A mode adds a tag saying whose it is (a clusterset, a claim's holder).
const (
	TagManagedBy = "clustermap.io/managed-by"
	ManagedBy    = "clustermap"
)

// Marked is the tags of something clustermap creates: the mark, then the
// mode's own.
func Marked(own ...types.Tag) []types.Tag {
	return append([]types.Tag{{Key: aws.String(TagManagedBy), Value: aws.String(ManagedBy)}}, own...)
}

// IsMarked says tags (as Tags reads them) carry the mark.
func IsMarked(tags map[string]string) bool { return tags[TagManagedBy] == ManagedBy }

// FanOut is how many calls of one batch run at once.
const FanOut = 8

// Each runs f for 0..n-1, FanOut at a time, every one of them (one error
// stops none of the others), and returns their errors joined.
func Each(ctx context.Context, n int, f func(ctx context.Context, i int) error) error {
	var g errgroup.Group
	g.SetLimit(FanOut)
	errs := make([]error, n)
	for i := range n {
		g.Go(func() error {
			errs[i] = f(ctx, i)
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(errs...)
}

// IsNotFound says Cloud Map has no such namespace, service or resource:
// positive knowledge of absence, unlike any other error.
func IsNotFound(err error) bool {
	var ns *types.NamespaceNotFound
	var svc *types.ServiceNotFound
	var res *types.ResourceNotFoundException
	return errors.As(err, &ns) || errors.As(err, &svc) || errors.As(err, &res)
}

// Kinds of call outcome operators tell apart: throttling calls for fewer
// calls or a higher quota, a denial for a policy fix, a missing resource is
// often normal.
const (
	KindOK           = "ok"
	KindThrottled    = "throttled"
	KindAccessDenied = "access_denied"
	KindNotFound     = "not_found"
	KindOther        = "other"
)

// ErrorKind sorts a call's error into one of the kinds.
func ErrorKind(err error) string {
	if err == nil {
		return KindOK
	}
	if IsNotFound(err) {
		return KindNotFound
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "ThrottlingException", "Throttling", "RequestLimitExceeded", "TooManyRequestsException", "RequestThrottled", "SlowDown":
			return KindThrottled
		case "AccessDeniedException", "AccessDenied", "UnauthorizedOperation", "UnauthorizedAccess":
			return KindAccessDenied
		}
	}
	return KindOther
}

// FindNamespace looks a namespace up by name, of type typ ("" any); nil
// when there is none.
func FindNamespace(ctx context.Context, c *sd.Client, name string, typ types.NamespaceType) (*types.NamespaceSummary, error) {
	return FindOwnedNamespace(ctx, c, name, typ, "")
}

// FindOwnedNamespace finds a namespace by name and type (any type when
// empty) owned by an account (any when empty): a namespace shared with the
// caller may carry the name of one of its own.
func FindOwnedNamespace(ctx context.Context, c *sd.Client, name string, typ types.NamespaceType, owner string) (*types.NamespaceSummary, error) {
	filters := []types.NamespaceFilter{{Name: types.NamespaceFilterNameName, Values: []string{name}, Condition: types.FilterConditionEq}}
	if typ != "" {
		filters = append(filters, types.NamespaceFilter{Name: types.NamespaceFilterNameType, Values: []string{string(typ)}})
	}
	p := sd.NewListNamespacesPaginator(c, &sd.ListNamespacesInput{Filters: filters})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, ns := range page.Namespaces {
			if aws.ToString(ns.Name) == name && (owner == "" || aws.ToString(ns.ResourceOwner) == owner) {
				return &ns, nil
			}
		}
	}
	return nil, nil
}

// Tags reads a resource's tags.
func Tags(ctx context.Context, c *sd.Client, arn *string) (map[string]string, error) {
	out, err := c.ListTagsForResource(ctx, &sd.ListTagsForResourceInput{ResourceARN: arn})
	if err != nil {
		return nil, err
	}
	tags := make(map[string]string, len(out.Tags))
	for _, t := range out.Tags {
		tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	return tags, nil
}

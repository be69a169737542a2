package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"golang.org/x/sync/errgroup"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
)

// Tags on Cloud Map services. The claim is how two Kubernetes Services, in
// any clusters, agree on who registers under a name: the first to tag it.
const (
	TagClaimedBy = "clustermap.io/claimed-by"
	TagCreatedBy = "clustermap.io/created-by"
)

// ErrNamespaceNotFound says the annotated Cloud Map namespace is missing.
var ErrNamespaceNotFound = errors.New("Cloud Map namespace not found")

// CloudMap is the thin adapter over the Cloud Map API.
type CloudMap struct{ c *sd.Client }

// Namespace is a Cloud Map namespace found by name.
type Namespace struct {
	ID   string
	Type types.NamespaceType
}

// Service is a claimed (or contested) Cloud Map service.
type Service struct {
	ID, ARN   string
	Holder    string // the claim's owner
	CreatedBy string
}

// FindNamespace looks a namespace up by name.
func (m CloudMap) FindNamespace(ctx context.Context, name string) (Namespace, error) {
	p := sd.NewListNamespacesPaginator(m.c, &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{
		{Name: types.NamespaceFilterNameName, Values: []string{name}, Condition: types.FilterConditionEq},
	}})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return Namespace{}, err
		}
		for _, ns := range page.Namespaces {
			if aws.ToString(ns.Name) == name {
				return Namespace{ID: aws.ToString(ns.Id), Type: ns.Type}, nil
			}
		}
	}
	return Namespace{}, fmt.Errorf("%w: %s", ErrNamespaceNotFound, name)
}

// DNSSettings shape a service clustermap creates.
type DNSSettings struct {
	TTL    int64
	Family string // "A" or "AAAA"
	SRV    bool
}

// Claim finds or creates the service name in ns and claims it for owner
// unless someone already holds it; Holder says who does.
func (m CloudMap) Claim(ctx context.Context, ns Namespace, name, owner string, dns DNSSettings) (Service, error) {
	in := &sd.CreateServiceInput{
		Name: aws.String(name), NamespaceId: aws.String(ns.ID),
		Description: aws.String("created by clustermap for " + owner),
		Tags:        []types.Tag{{Key: aws.String(TagClaimedBy), Value: aws.String(owner)}, {Key: aws.String(TagCreatedBy), Value: aws.String(owner)}},
	}
	if ns.Type != types.NamespaceTypeHttp {
		recs := []types.DnsRecord{{Type: types.RecordType(dns.Family), TTL: aws.Int64(dns.TTL)}}
		if dns.SRV {
			recs = append(recs, types.DnsRecord{Type: types.RecordTypeSrv, TTL: aws.Int64(dns.TTL)})
		}
		in.DnsConfig = &types.DnsConfig{RoutingPolicy: types.RoutingPolicyMultivalue, DnsRecords: recs}
	}
	out, err := m.c.CreateService(ctx, in)
	var exists *types.ServiceAlreadyExists
	switch {
	case err == nil:
		return Service{ID: aws.ToString(out.Service.Id), ARN: aws.ToString(out.Service.Arn), Holder: owner, CreatedBy: owner}, nil
	case !errors.As(err, &exists):
		return Service{}, fmt.Errorf("creating Cloud Map service %s: %w", name, err)
	}
	got, err := m.c.GetService(ctx, &sd.GetServiceInput{Id: exists.ServiceId})
	if err != nil {
		return Service{}, err
	}
	svc := Service{ID: aws.ToString(got.Service.Id), ARN: aws.ToString(got.Service.Arn)}
	if err := m.readClaim(ctx, &svc); err != nil || svc.Holder != "" {
		return svc, err
	}
	// Unclaimed: tag it, then read back. Tagging is last-writer-wins, so two
	// claimants racing both read the same final holder and one backs off.
	if _, err := m.c.TagResource(ctx, &sd.TagResourceInput{ResourceARN: aws.String(svc.ARN),
		Tags: []types.Tag{{Key: aws.String(TagClaimedBy), Value: aws.String(owner)}}}); err != nil {
		return svc, err
	}
	return svc, m.readClaim(ctx, &svc)
}

// FindService looks a service up by name, without creating it.
func (m CloudMap) FindService(ctx context.Context, ns Namespace, name string) (Service, bool, error) {
	p := sd.NewListServicesPaginator(m.c, &sd.ListServicesInput{Filters: []types.ServiceFilter{
		{Name: types.ServiceFilterNameNamespaceId, Values: []string{ns.ID}, Condition: types.FilterConditionEq},
	}})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return Service{}, false, err
		}
		for _, s := range page.Services {
			if aws.ToString(s.Name) == name {
				svc := Service{ID: aws.ToString(s.Id), ARN: aws.ToString(s.Arn)}
				return svc, true, m.readClaim(ctx, &svc)
			}
		}
	}
	return Service{}, false, nil
}

func (m CloudMap) readClaim(ctx context.Context, svc *Service) error {
	tags, err := m.c.ListTagsForResource(ctx, &sd.ListTagsForResourceInput{ResourceARN: aws.String(svc.ARN)})
	if err != nil {
		return err
	}
	svc.Holder, svc.CreatedBy = "", ""
	for _, t := range tags.Tags {
		switch aws.ToString(t.Key) {
		case TagClaimedBy:
			svc.Holder = aws.ToString(t.Value)
		case TagCreatedBy:
			svc.CreatedBy = aws.ToString(t.Value)
		}
	}
	return nil
}

// Instances lists every instance of a service, ours and others'.
func (m CloudMap) Instances(ctx context.Context, serviceID string) (map[string]Attrs, error) {
	out := map[string]Attrs{}
	p := sd.NewListInstancesPaginator(m.c, &sd.ListInstancesInput{ServiceId: aws.String(serviceID)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, err
		}
		for _, in := range page.Instances {
			out[aws.ToString(in.Id)] = in.Attributes
		}
	}
	return out, nil
}

// Apply registers, then deregisters (so that a name never goes empty
// while it changes), a few calls at a time, waiting for the operations when
// wait is set. It returns what succeeded.
func (m CloudMap) Apply(ctx context.Context, serviceID string, p Plan, wait bool) (registered, deregistered []string, err error) {
	regs := make([]string, 0, len(p.Register))
	for id := range p.Register {
		regs = append(regs, id)
	}
	registered, err1 := m.each(ctx, regs, wait, func(id string) (*string, error) {
		out, err := m.c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(serviceID), InstanceId: aws.String(id), Attributes: p.Register[id]})
		if err != nil {
			return nil, err
		}
		return out.OperationId, nil
	})
	deregistered, err2 := m.each(ctx, p.Deregister, wait, func(id string) (*string, error) {
		out, err := m.c.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: aws.String(serviceID), InstanceId: aws.String(id)})
		var gone *types.InstanceNotFound
		if errors.As(err, &gone) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return out.OperationId, nil
	})
	return registered, deregistered, errors.Join(err1, err2)
}

// each calls f for every id, 8 at a time, and returns the ids that worked.
func (m CloudMap) each(ctx context.Context, ids []string, wait bool, f func(string) (*string, error)) (ok []string, err error) {
	var mu sync.Mutex
	var errs []error
	var g errgroup.Group
	g.SetLimit(8)
	for _, id := range ids {
		g.Go(func() error {
			op, err := f(id)
			if err == nil && wait && op != nil {
				_, err = cloudmapclient.WaitOperation(ctx, m.c, op)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("instance %s: %w", id, err))
				return nil
			}
			ok = append(ok, id)
			return nil
		})
	}
	_ = g.Wait()
	return ok, errors.Join(errs...)
}

// Release gives a service up: deletes it if owner created it and it is
// empty, otherwise drops owner's claim. Our instances must be gone first.
func (m CloudMap) Release(ctx context.Context, svc Service, owner string) error {
	if svc.CreatedBy == owner {
		_, err := m.c.DeleteService(ctx, &sd.DeleteServiceInput{Id: aws.String(svc.ID)})
		var inUse *types.ResourceInUse
		var gone *types.ServiceNotFound
		switch {
		case err == nil || errors.As(err, &gone):
			return nil
		case !errors.As(err, &inUse):
			return err
		}
		// Others registered beside us: leave it to them.
	}
	if svc.Holder != owner {
		return nil
	}
	_, err := m.c.UntagResource(ctx, &sd.UntagResourceInput{ResourceARN: aws.String(svc.ARN), TagKeys: []string{TagClaimedBy}})
	var gone *types.ResourceNotFoundException
	if errors.As(err, &gone) {
		return nil
	}
	return err
}

// IsServiceGone reports a service deleted behind our back.
func IsServiceGone(err error) bool {
	var gone *types.ServiceNotFound
	var res *types.ResourceNotFoundException
	return errors.As(err, &gone) || errors.As(err, &res)
}

package cloudmap

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/registry"
)

// eachService lists the clusterset's services: those of every HTTP
// namespace its account holds, but the change records'. namespace hears
// each namespace (name and how calls name it) before its services; f hears
// each service and how calls name it. The first error ends the listing.
// ServiceCount is not consulted: it lags, and a namespace skipped would
// make its services look gone.
func (b *Backend) eachService(ctx context.Context, namespace func(name, ref string), f func(key registry.Key, ref string) error) error {
	nsPages := sd.NewListNamespacesPaginator(b.c, &sd.ListNamespacesInput{Filters: []types.NamespaceFilter{
		{Name: types.NamespaceFilterNameType, Values: []string{string(types.NamespaceTypeHttp)}},
	}})
	for nsPages.HasMorePages() {
		page, err := nsPages.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, ns := range page.Namespaces {
			name, ref := aws.ToString(ns.Name), b.tenancy.ref(ns.Id, ns.Arn)
			if !b.tenancy.holds(ns.ResourceOwner) || name == ChangesNamespace(b.o.ClusterSet) {
				continue // not the clusterset's: this account's own, or the change records
			}
			if namespace != nil {
				namespace(name, ref)
			}
			svcPages := sd.NewListServicesPaginator(b.c, &sd.ListServicesInput{Filters: []types.ServiceFilter{
				{Name: types.ServiceFilterNameNamespaceId, Values: []string{ref}},
			}})
			for svcPages.HasMorePages() {
				sp, err := svcPages.NextPage(ctx)
				if err != nil {
					return err
				}
				for _, s := range sp.Services {
					if err := f(registry.Key{Namespace: name, Name: aws.ToString(s.Name)}, b.tenancy.ref(s.Id, s.Arn)); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// eachInstance lists a service's instances (ListInstances, the control
// plane: it does not lag as DiscoverInstances does) until f says stop.
func (b *Backend) eachInstance(ctx context.Context, ref string, f func(in types.InstanceSummary) (more bool)) error {
	p := sd.NewListInstancesPaginator(b.c, &sd.ListInstancesInput{ServiceId: aws.String(ref), MaxResults: aws.Int32(100)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, in := range page.Instances {
			if !f(in) {
				return nil
			}
		}
	}
	return nil
}

package cloudmap

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// Across accounts a record's attributes prove nothing about its writer:
// any member may register any CLUSTER_ID. Cloud Map records the account
// that created each instance (CreatedByAccount, on ListInstances, a
// control-plane call; DiscoverInstances does not say). Each cluster is
// bound to one account: this cluster to its own, another to the account
// that created its change record (read when the cluster first appears) or,
// before that record is read, of its first record read. Records under a
// cluster's name created by another account are refused and reported.
// What a binding cannot tell: who was first, for a cluster whose records
// another account forged before this controller first read them.

// bind returns the account cluster is bound to, binding it to account
// when it has none.
func (b *Backend) bind(cluster, account string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bound == nil {
		b.bound = map[string]string{}
		if b.o.Account != "" {
			b.bound[b.o.Cluster] = b.o.Account
		}
	}
	if cur, ok := b.bound[cluster]; ok {
		return cur
	}
	b.bound[cluster] = account
	return account
}

// boundTo is the account cluster is bound to, if any.
func (b *Backend) boundTo(cluster string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.bound[cluster]
	return a, ok
}

// creators lists who created each instance of a service (instance id ->
// account).
func (b *Backend) creators(ctx context.Context, key registry.Key) (map[string]string, error) {
	ref, err := b.serviceID(ctx, key)
	if err != nil {
		return nil, err
	}
	if ref == "" {
		return nil, fmt.Errorf("service %s not found to list who created its instances: read again", key)
	}
	out := map[string]string{}
	err = b.eachInstance(ctx, ref, func(in types.InstanceSummary) bool {
		out[aws.ToString(in.Id)] = aws.ToString(in.CreatedByAccount)
		return true
	})
	return out, err
}

// refuseForeign keeps, across accounts, the instances created by the
// account their cluster is bound to; the others are reported. It returns
// who created each instance (id -> account). One account needs no check
// (and makes no call).
func (b *Backend) refuseForeign(ctx context.Context, key registry.Key, instances []recordfmt.Instance) ([]recordfmt.Instance, map[string]string, error) {
	if !b.tenancy.bindsWriters() || len(instances) == 0 {
		return instances, nil, nil
	}
	creators, err := b.creators(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	kept := make([]recordfmt.Instance, 0, len(instances))
	for _, in := range instances {
		cluster := in.Attrs[recordfmt.AttrClusterID]
		if cluster == "" {
			continue // nobody's (Decode drops it too)
		}
		by, ok := creators[in.ID]
		if !ok {
			// Registered between the two reads: the next read decides.
			return nil, nil, fmt.Errorf("instance %s of %s is not listed yet: read again", in.ID, key)
		}
		if bound := b.bind(cluster, by); bound != by {
			b.reportForeign(registry.ForeignRecord{Key: key, Cluster: cluster, CreatedBy: by, Bound: bound})
			continue
		}
		kept = append(kept, in)
	}
	return kept, creators, nil
}

// ownedOnly keeps, across accounts, the instances among ids this account
// created: records another account wrote under this cluster's name are
// reported and left alone (removing them may be refused, and would fail
// the export or its withdrawal for good). One account needs no check.
func (b *Backend) ownedOnly(ctx context.Context, key registry.Key, ids []string) ([]string, error) {
	if !b.tenancy.bindsWriters() || b.o.Account == "" || len(ids) == 0 {
		return ids, nil
	}
	creators, err := b.creators(ctx, key)
	if err != nil {
		return nil, err
	}
	kept := make([]string, 0, len(ids))
	for _, id := range ids {
		by, listed := creators[id]
		switch {
		case !listed:
			// Gone meanwhile (or not listed yet): a deregistration of
			// what is gone is fine, of what another wrote is refused.
			kept = append(kept, id)
		case by != b.o.Account:
			b.reportForeign(registry.ForeignRecord{Key: key, Cluster: b.o.Cluster, CreatedBy: by, Bound: b.o.Account})
		default:
			kept = append(kept, id)
		}
	}
	return kept, nil
}

// bindRecords binds the clusters of change records not bound yet to the
// accounts that created them (one listing of the records' service, only
// when a cluster is new).
func (b *Backend) bindRecords(ctx context.Context, clusters []string) error {
	var unbound bool
	for _, c := range clusters {
		if _, ok := b.boundTo(c); !ok {
			unbound = true
		}
	}
	if !unbound {
		return nil
	}
	creators, err := b.creators(ctx, registry.Key{Namespace: ChangesNamespace(b.o.ClusterSet), Name: ChangesService})
	if err != nil {
		return err
	}
	// A change record's instance id is its cluster's name.
	for _, c := range clusters {
		if by, ok := creators[c]; ok {
			if bound := b.bind(c, by); bound != by {
				b.reportForeign(registry.ForeignRecord{Key: registry.Key{Namespace: ChangesNamespace(b.o.ClusterSet), Name: ChangesService}, Cluster: c, CreatedBy: by, Bound: bound})
			}
		}
	}
	return nil
}

// foreignRecords lists, among the change records that check picks, those
// another account than their cluster's wrote (reported). One listing of
// the records' service, only when check picks one.
func (b *Backend) foreignRecords(ctx context.Context, records []types.HttpInstanceSummary, check func(cluster string, attrs map[string]string) bool) (map[string]bool, error) {
	var picked []types.HttpInstanceSummary
	for _, in := range records {
		if check(in.Attributes[recordfmt.AttrClusterID], in.Attributes) {
			picked = append(picked, in)
		}
	}
	if len(picked) == 0 {
		return nil, nil
	}
	key := registry.Key{Namespace: ChangesNamespace(b.o.ClusterSet), Name: ChangesService}
	creators, err := b.creators(ctx, key)
	if err != nil {
		return nil, err
	}
	foreign := map[string]bool{}
	for _, in := range picked {
		cluster, by := in.Attributes[recordfmt.AttrClusterID], creators[aws.ToString(in.InstanceId)]
		if bound, ok := b.boundTo(cluster); ok && by != bound {
			foreign[cluster] = true
			if by != "" { // else not listed yet: the next move asks again
				b.reportForeign(registry.ForeignRecord{Key: key, Cluster: cluster, CreatedBy: by, Bound: bound})
			}
		}
	}
	return foreign, nil
}

func (b *Backend) reportForeign(f registry.ForeignRecord) {
	if !b.due("foreign " + f.Cluster + " " + f.CreatedBy) {
		return
	}
	b.o.Log.Error(nil, "refused records under another account's cluster: Cloud Map says another account created them; that account writes under a name not its own (a misconfigured --cluster-name, or a hostile member)",
		"cluster", f.Cluster, "service", f.Key.String(), "createdBy", f.CreatedBy, "clusterAccount", f.Bound)
	b.o.Observer.Foreign(f)
}

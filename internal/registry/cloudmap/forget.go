package cloudmap

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/go-logr/logr"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// ForgetOptions name a cluster gone for good and where its records are.
type ForgetOptions struct {
	ClusterSet, Cluster string
	// Owner is the account owning the clusterset's namespaces across
	// accounts (the caller must be it: only the owner may deregister
	// another account's records); empty in one account.
	Owner string
	// SilentAfter: a cluster that proved alive more recently is refused
	// unless Force.
	SilentAfter time.Duration
	Force       bool
	// OnlyClustermap keeps the records another controller wrote under the
	// cluster's id (the AWS controller's, on the way back from a
	// migration): only clustermap's, and its proof of life, go.
	OnlyClustermap bool
}

// AliveError refuses to forget a cluster that proved alive recently.
type AliveError struct {
	Cluster string
	Last    time.Time
}

func (e *AliveError) Error() string {
	return fmt.Sprintf("cluster %s proved alive at %s, within the silent-cluster TTL: it is not gone (stop it, or uninstall it: clustermap uninstall); --force forgets it anyway",
		e.Cluster, e.Last.UTC().Format(time.RFC3339))
}

// Forget deregisters every record a cluster left in the clusterset's
// namespaces of this client's Region, then its change record: importers
// read every service again when a record goes, so it leaves every import.
// Forced, it does so again once every write the cluster may have had
// under way has ended (about 15 s). It returns how many records went.
func Forget(ctx context.Context, c *sd.Client, o ForgetOptions) (int, error) {
	b := New(c, Options{ClusterSet: o.ClusterSet, Cluster: o.Cluster, Owner: o.Owner, Account: o.Owner, Log: logr.Discard()})
	var recordSvc, mark string
	// Read twice, a read lag apart: a read may trail the cluster's latest
	// proof, and a live cluster must never be forgotten for a stale read.
	// Alive is what importers judge by, on this clock: the record moved
	// between the reads. A forget cannot watch for the TTL as they do, so
	// the time the record states within the TTL refuses too.
	for i, reads := 0, 2; i < reads; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(DefaultReadLag):
			}
		}
		records, err := b.readRecords(ctx)
		if err != nil {
			return 0, err
		}
		if records == nil {
			continue
		}
		for _, in := range records.Instances {
			if id, ok := b.recordOf(in); !ok || id != o.Cluster {
				continue // another's, or misfiled under another id: proves nothing
			}
			alive := o.SilentAfter > 0 && !o.Force
			if r, ok := parseRecord(in.Attributes); ok && alive && time.Since(r.updated) <= max(o.SilentAfter, silentBeats*r.beat) {
				return 0, &AliveError{Cluster: o.Cluster, Last: r.updated}
			}
			if m := recordMark(in.Attributes); alive && mark != "" && m != mark {
				return 0, &AliveError{Cluster: o.Cluster, Last: time.Now()}
			} else {
				mark = m
			}
			recordSvc = aws.ToString(in.ServiceName)
		}
		if o.Force {
			break
		}
	}
	n, err := b.forgetAll(ctx, recordSvc != "", o.OnlyClustermap)
	if err != nil || !o.Force {
		return n, err
	}
	// Forced, the cluster may have been writing until a moment ago: a
	// registration it started may still run, which no read shows until
	// it ends. Once every such write has ended and reads show it, again.
	select {
	case <-ctx.Done():
		return n, ctx.Err()
	case <-time.After(cloudmapclient.OperationRun + DefaultReadLag):
	}
	more, err := b.forgetAll(ctx, true, o.OnlyClustermap)
	return n + more, err
}

// forgetAll deregisters the cluster's records in every namespace of the
// clusterset, then (withRecord) its change record, and says how many.
func (b *Backend) forgetAll(ctx context.Context, withRecord, onlyClustermap bool) (int, error) {
	n := 0
	if err := b.eachService(ctx, nil, func(key registry.Key, ref string) error {
		gone, err := b.forgetIn(ctx, key.Namespace, key.Name, ref, onlyClustermap)
		n += gone
		return err
	}); err != nil {
		return n, err
	}
	if withRecord {
		gone, err := b.forgetIn(ctx, ChangesNamespace(b.o.ClusterSet), ChangesService, "", false)
		return n + gone, err
	}
	return n, nil
}

// forgetIn deregisters the cluster's records of one service (svcRef ""
// finds the service by name), with onlyClustermap those clustermap wrote.
func (b *Backend) forgetIn(ctx context.Context, ns, svc, svcRef string, onlyClustermap bool) (int, error) {
	out, err := b.c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
		NamespaceName: aws.String(ns), ServiceName: aws.String(svc), HealthStatus: types.HealthStatusFilterAll, OwnerAccount: b.tenancy.ownerAccount(),
		QueryParameters: map[string]string{recordfmt.AttrClusterID: b.o.Cluster, recordfmt.AttrClusterSetID: b.o.ClusterSet}, MaxResults: aws.Int32(recordfmt.MaxInstances),
	})
	if isNotFound(err) {
		return 0, nil
	}
	if err != nil || len(out.Instances) == 0 {
		return 0, err
	}
	if svcRef == "" {
		if svcRef, err = b.serviceID(ctx, registry.Key{Namespace: ns, Name: svc}); err != nil {
			return 0, err
		}
	}
	var writes []cloudmapclient.Write
	for _, in := range out.Instances {
		if !onlyClustermap || recordfmt.WrittenByClustermap(in.Attributes) {
			writes = append(writes, cloudmapclient.Write{ID: aws.ToString(in.InstanceId)})
		}
	}
	var n atomic.Int64
	err = cloudmapclient.WriteInstances(ctx, b.c, svcRef, writes, func(i int, o cloudmapclient.Outcome) error {
		if o.Err != nil && !o.Missing {
			return fmt.Errorf("deregistering %s from %s/%s: %w", writes[i].ID, ns, svc, o.Err)
		}
		n.Add(1)
		return nil
	})
	return int(n.Load()), err
}

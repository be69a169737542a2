package cloudmap

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
)

// recordsFeed is the change feed across accounts: each other cluster's
// change record (shared.go), read when their service's revision moves.
type recordsFeed struct {
	*Watcher
	// rev is the records' service revision last read; marks each other
	// cluster's epoch and sequence as last read.
	rev      int64
	marks    map[string]feedMark
	lastSeen map[string]time.Time // each other cluster's record's time
	stale    map[string]bool      // clusters whose exports are dropped
}

func newRecordsFeed(w *Watcher) *recordsFeed {
	return &recordsFeed{Watcher: w, rev: -1, marks: map[string]feedMark{}, lastSeen: map[string]time.Time{}, stale: map[string]bool{}}
}

func (f *recordsFeed) baseline(ctx context.Context) error { return f.read(ctx, true) }
func (f *recordsFeed) poll(ctx context.Context) error     { return f.read(ctx, false) }
func (f *recordsFeed) dropped(cluster string) bool        { return f.stale[cluster] }
func (f *recordsFeed) caughtUp(time.Time)                 {}

// read reads the other clusters' change records when their
// service's revision moved and marks the services they changed since the
// last read; a record that no longer holds all of that asks for a
// catch-up. With baseline, it only notes where each record stands.
func (f *recordsFeed) read(ctx context.Context, baseline bool) error {
	now := f.clock.Now
	ns := aws.String(ChangesNamespace(f.b.o.ClusterSet))
	rev, err := f.b.c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{
		NamespaceName: ns, ServiceName: aws.String(ChangesService), OwnerAccount: f.b.ownerAccount(),
	})
	if err == nil && !baseline && aws.ToInt64(rev.InstancesRevision) == f.rev {
		f.clock.LastPoll = now
		f.judgeStale(now)
		return nil
	}
	var out *sd.DiscoverInstancesOutput
	if err == nil {
		out, err = f.b.c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{
			NamespaceName: ns, ServiceName: aws.String(ChangesService), OwnerAccount: f.b.ownerAccount(),
			HealthStatus: types.HealthStatusFilterAll, MaxResults: aws.Int32(MaxInstances),
			QueryParameters: map[string]string{AttrClusterSetID: f.b.o.ClusterSet},
		})
	}
	if isNotFound(err) {
		// No cluster wrote a record yet (or the namespace is not shared
		// with this account: the exports say so).
		f.clock.LastPoll = now
		return nil
	}
	if err != nil {
		return err
	}
	var clusters []string
	for _, in := range out.Instances {
		if c := in.Attributes[AttrClusterID]; c != "" && c != f.b.o.Cluster {
			clusters = append(clusters, c)
		}
	}
	if err := f.b.bindRecords(ctx, clusters); err != nil {
		return err
	}
	defer f.judgeStale(now)
	for _, in := range out.Instances {
		cluster := in.Attributes[AttrClusterID]
		if cluster == f.b.o.Cluster {
			continue // this cluster's changes are read back directly
		}
		r, ok := parseRecord(in.Attributes)
		if !ok {
			// A record this release cannot read (a newer writer's, say):
			// each change of it is caught up, not read.
			mark := feedMark{epoch: "unreadable " + in.Attributes[attrEpoch] + "/" + in.Attributes[attrSeq]}
			if f.marks[cluster] != mark && !baseline {
				f.clock.CatchUpWanted = true
			}
			f.marks[cluster] = mark
			continue
		}
		prev := f.marks[cluster]
		f.marks[cluster] = feedMark{r.epoch, r.seq}
		f.lastSeen[cluster] = r.updated
		if baseline {
			continue
		}
		keys, complete := r.since(prev.epoch, prev.seq)
		if !complete {
			f.clock.CatchUpWanted = true
			continue
		}
		for _, key := range keys {
			f.dirty[key] = time.Time{}
			f.clock.LastChange = now
		}
	}
	f.rev = aws.ToInt64(out.InstancesRevision)
	f.clock.LastPoll = now
	return nil
}

// judgeStale drops the exports of clusters whose change record is older
// than StaleAfter and takes back those that wrote again: every service is
// read anew (once per such change, data-plane calls).
func (f *recordsFeed) judgeStale(now time.Time) {
	if f.opts.StaleAfter <= 0 {
		return
	}
	changed := false
	for cluster, seen := range f.lastSeen {
		stale := now.Sub(seen) > f.opts.StaleAfter
		if stale == f.stale[cluster] {
			continue
		}
		changed = true
		if stale {
			f.stale[cluster] = true
			f.b.o.Log.Info("dropping the exports of a cluster whose change record is stale: it lost access to the clusterset's namespaces, or is gone",
				"cluster", cluster, "lastSeen", seen, "staleAfter", f.opts.StaleAfter)
		} else {
			delete(f.stale, cluster)
			f.b.o.Log.Info("a cluster whose exports were dropped writes its change record again; importing them again", "cluster", cluster)
		}
		if f.b.o.OnStale != nil {
			f.b.o.OnStale(cluster, seen, stale)
		}
	}
	if changed {
		for key := range f.revisions {
			f.dirty[key] = time.Time{}
		}
		for key := range f.exported {
			f.dirty[key] = time.Time{}
		}
	}
}

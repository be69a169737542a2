package cloudmap

import (
	"context"
	"maps"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// recordsFeed is the change feed across accounts: each other cluster's
// change record (changerecord.go), read when their service's revision moves.
type recordsFeed struct {
	*Watcher
	// rev is the records' service revision last read; marks each other
	// cluster's epoch and sequence as last read.
	rev   int64
	marks map[string]feedMark
	// behind counts reads in a row at a revision before rev.
	behind int
	// distrusted are clusters whose record, as last read, another account
	// wrote: it proves them alive no more.
	distrusted map[string]bool
}

func newRecordsFeed(w *Watcher) *recordsFeed {
	return &recordsFeed{Watcher: w, rev: -1, marks: map[string]feedMark{}}
}

func (f *recordsFeed) baseline(ctx context.Context) (func(), error) {
	marks, rev := maps.Clone(f.marks), f.rev
	return func() { f.marks, f.rev = marks, rev }, f.read(ctx, true)
}

func (f *recordsFeed) poll(ctx context.Context) error { return f.read(ctx, false) }

// read reads the other clusters' change records when their
// service's revision moved and marks the services they changed since the
// last read; a record that no longer holds all of that asks for a
// catch-up. With baseline, it only notes where each record stands.
func (f *recordsFeed) read(ctx context.Context, baseline bool) error {
	now := f.clock.Now
	ns := aws.String(ChangesNamespace(f.b.o.ClusterSet))
	rev, err := f.b.c.DiscoverInstancesRevision(ctx, &sd.DiscoverInstancesRevisionInput{
		NamespaceName: ns, ServiceName: aws.String(ChangesService), OwnerAccount: f.b.tenancy.ownerAccount(),
	})
	if err == nil && !baseline && aws.ToInt64(rev.InstancesRevision) == f.rev {
		f.clock.LastPoll = now
		f.proved(now, f.records, f.recordRev, f.distrusted)
		return nil
	}
	var out *sd.DiscoverInstancesOutput
	if err == nil || isNotFound(err) {
		out, err = f.b.readRecords(ctx)
	}
	if err != nil {
		return err
	}
	if out == nil {
		// No cluster wrote a record yet (or the namespace is not shared
		// with this account: the exports say so).
		f.clock.LastPoll = now
		f.proved(now, nil, -1, nil)
		return nil
	}
	if !baseline && aws.ToInt64(out.InstancesRevision) < f.rev && f.behind < maxBehind {
		// A read behind the last (Cloud Map's reads may trail its
		// writes): nothing new. Many in a row: the records were made anew.
		f.behind++
		f.clock.LastPoll = now
		return nil
	}
	f.behind = 0
	var clusters []string
	var records []types.HttpInstanceSummary
	for _, in := range out.Instances {
		if c, ok := f.b.recordOf(in); ok {
			records = append(records, in)
			if c != f.b.o.Cluster {
				clusters = append(clusters, c)
			}
		}
	}
	if err := f.b.bindRecords(ctx, clusters); err != nil {
		return err
	}
	// A drained cluster comes back only by a record its own account wrote:
	// with permissive sharing any member may rewrite anyone's.
	f.distrusted, err = f.b.foreignRecords(ctx, records, func(cluster string, attrs map[string]string) bool {
		return !f.alive.silentSince(cluster).IsZero() && f.alive.moved(cluster, attrs)
	})
	if err != nil {
		return err
	}
	defer f.proved(now, records, aws.ToInt64(out.InstancesRevision), f.distrusted)
	present := map[string]bool{}
	for _, c := range clusters {
		present[c] = true
	}
	for cluster := range f.marks {
		if !present[cluster] {
			// Its record went (clustermap forget-cluster, run by the owner,
			// whose deregistrations this account cannot see): read
			// everything again.
			delete(f.marks, cluster)
			f.clock.CatchUpWanted = !baseline
		}
	}
	for _, in := range records {
		cluster := in.Attributes[recordfmt.AttrClusterID]
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
		if baseline {
			continue
		}
		keys, complete := r.since(prev.epoch, prev.seq)
		if !complete {
			f.clock.CatchUpWanted = true
			continue
		}
		for _, key := range keys {
			f.heardEarly(key, f.clock.Now)
			f.clock.LastChange = now
		}
	}
	f.rev = aws.ToInt64(out.InstancesRevision)
	f.clock.LastPoll = now
	return nil
}

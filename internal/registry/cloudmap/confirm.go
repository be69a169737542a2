package cloudmap

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
)

// In a shared namespace ListOperations lists none of this cluster's
// operations, so no change feed tells it how they ended. It asks
// GetOperation (with the owner account, as a shared namespace requires)
// for each once it may have ended, a few at a time: a write Cloud Map
// accepted and failed later is then written again within seconds, as in
// one account, instead of after registrationTimeout (an export's
// records) or the next heartbeat (the change record, without which no
// other account hears of this cluster's changes).
//
// In one account the change feed tells it, but not always: a poll that
// is refused, or that pages past an operation in a busy account during a
// bulk export, misses it. Such an operation is asked about once it has
// gone unseen for unseenAfter, not given up only after the feed's 100 s.
const (
	// confirmInterval spaces the rounds of questions.
	confirmInterval = 1500 * time.Millisecond
	// confirmAfter is how long an operation runs before it is asked
	// about: Cloud Map's take seconds, and each question is a call.
	confirmAfter = 2 * time.Second
	// unseenAfter is confirmAfter in one account: by then the feed's
	// polls (every 1.5 s) would have seen the longest operation (4 s in
	// the AWS profile) end several times over.
	unseenAfter = 15 * time.Second
	// confirmBatch bounds the questions of a round (under 3 calls/s):
	// during a bulk export the oldest are asked first and those older
	// than ownOpMemory are given up; registrationTimeout still covers
	// those an export waits for.
	confirmBatch = 4
	// ownOpMemory is how long an operation no one confirmed is kept.
	ownOpMemory = 2 * time.Minute
)

// confirmOwnOps asks how this cluster's operations running for longer
// than after ended, until ctx ends, and tells the backend, as the
// operations feed does in one account.
func (b *Backend) confirmOwnOps(ctx context.Context, after time.Duration) {
	t := time.NewTicker(confirmInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		b.expireOwnOps(now.Add(-ownOpMemory))
		for _, id := range b.unconfirmed(now.Add(-after), confirmBatch) {
			if !b.confirm(ctx, id) {
				break // throttled or unreachable: asked again next round
			}
		}
	}
}

// confirm asks how operation id ended; false when the question failed.
func (b *Backend) confirm(ctx context.Context, id string) bool {
	out, err := b.c.GetOperation(ctx, &sd.GetOperationInput{OperationId: aws.String(id), OwnerAccount: b.tenancy.ownerAccount()})
	var gone *types.OperationNotFound
	switch {
	case errors.As(err, &gone):
		b.takeOwnOp(id) // nothing to learn about it
	case err != nil:
		if cloudmapclient.ErrorKind(err) == cloudmapclient.KindAccessDenied && b.due("GetOperation denied") {
			b.o.Log.Error(err, "this account may not ask how its Cloud Map writes ended: a write that fails after it was accepted is written again only after 30 s, or at the next change; grant servicediscovery:GetOperation (iam/mcs-shared-member.json)")
		}
		return false
	case out.Operation.Status == types.OperationStatusSuccess || out.Operation.Status == types.OperationStatusFail:
		if mine, ok := b.takeOwnOp(id); ok {
			b.opFinished(ctx, id, mine.key, mine.started, out.Operation.Status == types.OperationStatusFail, out.Operation)
		}
	}
	return true // or still running: asked again next round
}

// unconfirmed are up to n of this cluster's operations started before
// cutoff, oldest first.
func (b *Backend) unconfirmed(cutoff time.Time, n int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []string
	for id, op := range b.ownOps {
		if op.started.Before(cutoff) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(x, y string) int { return b.ownOps[x].started.Compare(b.ownOps[y].started) })
	return ids[:min(n, len(ids))]
}

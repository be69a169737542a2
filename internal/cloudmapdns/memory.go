// What the reconciler remembers between reconciles: registered Services,
// waiters, namespace ids.

package cloudmapdns

import (
	"context"
	"time"

	ktypes "k8s.io/apimachinery/pkg/types"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
)

type cachedNamespace struct {
	ns   Namespace
	read time.Time
}

// entry is what clustermap knows of one registered Service.
type entry struct {
	target  Target
	ns      Namespace
	claim   Claim            // held
	service string           // the Cloud Map service registered in
	current map[string]Attrs // every instance of it, as last read or written
	stale   bool             // re-read the claim and current before planning (drift check)
	// running are the operations of writes not yet seen ended, looked up
	// from checkAt on: Cloud Map may accept a write and then FAIL it.
	running []string
	checkAt time.Time
	failed  error // the last late failure, until the writes made again succeed
	// rereadAt is when a read made as a new leader, or after a write whose
	// call failed (it may have been made all the same), is made again:
	// that write has ended by then.
	rereadAt time.Time
	unsureAt time.Time // the last write whose call failed
	// readMidWrite: the last read was taken while writes in running ran;
	// it is made again once they have ended.
	readMidWrite bool
}

// remembered is where memory says the Service is registered.
func (r *Reconciler) remembered(key ktypes.NamespacedName) *Target {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.entries[key]; e != nil {
		t := e.target
		return &t
	}
	return nil
}

func (r *Reconciler) forget(key ktypes.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.entries, key)
	for _, w := range r.waiting {
		delete(w, key)
	}
}

// unseenUntil is when every write a listing of e's service may not show
// yet has ended: the previous leader's, and ours whose call failed (it may
// have been made all the same). Writes of ours that were answered are in
// e.running until seen ended.
func (r *Reconciler) unseenUntil(e *entry) time.Time {
	since := r.leading
	if e != nil && e.unsureAt.After(since) {
		since = e.unsureAt
	}
	return since.Add(cloudmapclient.OperationRun)
}

func (r *Reconciler) markStale(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.stale = true
}

// lastSeen is the claim a waiter last read on target, which spares a
// read when the lock has not changed.
func (r *Reconciler) lastSeen(target Target) Claim {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.waiting[target] {
		if c != nil {
			return *c
		}
	}
	return Claim{}
}

// namespace finds a Cloud Map namespace by name, remembering it for a
// drift period: every claim and every waiter's poll needs it, and a
// namespace cannot be replaced while it holds services.
func (r *Reconciler) namespace(ctx context.Context, name string) (Namespace, error) {
	r.mu.Lock()
	c, ok := r.nsCache[name]
	r.mu.Unlock()
	if ok && time.Since(c.read) < r.DriftPeriod {
		return c.ns, nil
	}
	ns, err := CloudMap{r.CloudMap}.FindNamespace(ctx, name)
	if err == nil {
		r.mu.Lock()
		r.nsCache[name] = cachedNamespace{ns, time.Now()}
		r.mu.Unlock()
	}
	return ns, err
}

package hub

import (
	"maps"
	"sync"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
)

// proofs is the members' liveness as one member watches it. A proof is
// when this watcher saw a member's Lease change (its resourceVersion), on
// the watcher's own clock: the time a Lease states is the writer's, and
// proves nothing. A member is drained when its Lease stood still for
// SilentAfter while another's moved: measured against the newest proof,
// never the clock, so that a hub that cannot be reached (every Lease
// stands still for this watcher, its own too) drains nobody. This member
// is never drained by itself.
type proofs struct {
	mu   sync.Mutex
	self string
	ttl  time.Duration
	// beat is the members' heartbeat: past two of them with no Lease
	// moving, every member stood still at once (stalled).
	beat   time.Duration
	rv     map[string]string
	at     map[string]time.Time
	silent map[string]time.Time
}

func newProofs(self string, ttl, beat time.Duration) *proofs {
	return &proofs{self: self, ttl: ttl, beat: beat, rv: map[string]string{}, at: map[string]time.Time{}, silent: map[string]time.Time{}}
}

// saw notes a member's Lease as read at now: a proof when it changed.
func (p *proofs) saw(cluster, rv string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rv[cluster] != rv {
		p.stalled(now)
		p.rv[cluster], p.at[cluster] = rv, now
	}
}

// stalled moves every live member's proof on by the time no Lease moved
// at all, past two heartbeats, before a proof at now: the hub was down or
// unreachable for everyone (this watcher too), which proves nobody
// silent. Else the first member seen renewing after an outage longer
// than the TTL would drain every other until its next renewal.
func (p *proofs) stalled(now time.Time) {
	var newest time.Time
	for c, at := range p.at {
		if _, drained := p.silent[c]; !drained && at.After(newest) {
			newest = at
		}
	}
	gap := now.Sub(newest) - 2*p.beat
	if newest.IsZero() || gap <= 0 {
		return
	}
	for c, at := range p.at {
		if _, drained := p.silent[c]; !drained {
			p.at[c] = at.Add(gap)
		}
	}
}

// gone drops a member whose Lease was deleted (forget-cluster): it is
// no longer judged, and restored if drained.
func (p *proofs) gone(cluster string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.rv, cluster)
	delete(p.at, cluster)
}

// judge drains and restores members from the proofs
// (registry.JudgeSilent); it returns those whose state changed.
func (p *proofs) judge() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return registry.JudgeSilent(p.at, p.silent, p.self, func(string) time.Duration { return p.ttl })
}

// silentSince is a drained member's last proof (zero: not drained).
func (p *proofs) silentSince(cluster string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.silent[cluster]
}

// lastProof is when a member last proved alive (or fallback if unknown).
func (p *proofs) lastProof(cluster string, fallback time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if at, ok := p.at[cluster]; ok {
		return at
	}
	return fallback
}

// snapshot is every member's last proof, and who is drained.
func (p *proofs) snapshot() (map[string]time.Time, map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	drained := map[string]bool{}
	for c := range p.silent {
		drained[c] = true
	}
	return maps.Clone(p.at), drained
}

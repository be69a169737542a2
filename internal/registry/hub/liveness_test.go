package hub

import (
	"testing"
	"time"
)

// After a time when no Lease moved at all (the hub down for everyone),
// the first member seen renewing drains nobody; a member that stops
// while others renew is drained a TTL after its last renewal.
func TestProofsAfterAStall(t *testing.T) {
	const beat, ttl = time.Second, 4 * time.Second
	t0 := time.Unix(1_700_000_000, 0)
	p := newProofs("self", ttl, beat)
	for _, c := range []string{"self", "a", "b"} {
		p.saw(c, "1", t0)
	}
	// The hub is down for 20 s; then self's renewal is seen first.
	p.saw("self", "2", t0.Add(20*time.Second))
	if changed := p.judge(); len(changed) != 0 {
		t.Fatalf("after an outage, the first renewal seen drained %v", changed)
	}
	p.saw("a", "2", t0.Add(20500*time.Millisecond))
	// b never renews again; self and a do, every beat.
	var drainedAt time.Time
	for i := 1; i <= 10; i++ {
		now := t0.Add(20*time.Second + time.Duration(i)*beat)
		p.saw("self", "s"+string(rune('a'+i)), now)
		p.saw("a", "a"+string(rune('a'+i)), now)
		if changed := p.judge(); len(changed) > 0 && drainedAt.IsZero() {
			if len(changed) != 1 || changed[0] != "b" {
				t.Fatalf("drained %v, want b", changed)
			}
			drainedAt = now
		}
	}
	if drainedAt.IsZero() {
		t.Fatal("b, silent while the others renewed, was never drained")
	}
	if !p.silentSince("a").IsZero() || !p.silentSince("self").IsZero() {
		t.Error("a renewing member was drained")
	}
}

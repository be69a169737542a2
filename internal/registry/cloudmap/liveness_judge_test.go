package cloudmap

import (
	"slices"
	"testing"
	"time"
)

// Drained only on positive knowledge: a cluster silent past the TTL while
// another proves alive; never this cluster, never all at once, restored
// on its next proof or when its record goes.
func TestLivenessJudge(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 30 * time.Minute
	l := newLiveness("self", ttl)
	old, fresh := now.Add(-ttl-time.Second), now.Add(-time.Minute)
	l.proofs = map[string]time.Time{"self": fresh, "a": old, "b": fresh}
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || l.silentSince("a") != old {
		t.Fatalf("judge %v, silent %v: want a drained", got, l.silent)
	}
	if got := l.judge(now); len(got) != 0 {
		t.Errorf("judged again: %v changed", got)
	}
	// Every record old (an outage, a clock): nobody drained.
	l.proofs = map[string]time.Time{"self": old, "a": old, "b": old}
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("every proof old: changed %v, silent %v; want a restored, nobody drained", got, l.silent)
	}
	// This cluster is never drained, whatever its record says.
	l.proofs = map[string]time.Time{"self": old, "b": fresh}
	if l.judge(now); len(l.silent) != 0 {
		t.Errorf("silent %v, want nobody (this cluster never)", l.silent)
	}
	// A proof restores; a record gone restores.
	l.proofs = map[string]time.Time{"self": fresh, "a": old}
	l.judge(now)
	l.proofs["a"] = fresh
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("after a's proof: changed %v, silent %v", got, l.silent)
	}
	l.proofs["a"] = old
	l.judge(now)
	delete(l.proofs, "a")
	if got := l.judge(now); !slices.Equal(got, []string{"a"}) || len(l.silent) != 0 {
		t.Errorf("after a's record went: changed %v, silent %v", got, l.silent)
	}
	// A negative TTL never drains.
	never := newLiveness("self", -1)
	never.proofs = map[string]time.Time{"self": fresh, "a": old}
	if got := never.judge(now); len(got) != 0 {
		t.Errorf("TTL off: %v drained", got)
	}
}

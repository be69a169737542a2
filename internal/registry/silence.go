package registry

import "time"

// JudgeSilent drains and restores clusters from their last proofs of life
// (when the reader last saw each one's liveness record move, on its own
// clock), updating silent (cluster -> last proof) and returning the
// clusters whose state changed. A cluster other than self is silent when
// its proof is older than silentAfter(cluster) (0: never) measured against
// the newest proof, not the clock: when every record stops at once (a
// registry refusing writes, an unreachable hub, a credential all share)
// nobody is drained, however long it lasts. A cluster without a proof
// (its record is gone) is silent no longer.
func JudgeSilent(proofs, silent map[string]time.Time, self string, silentAfter func(cluster string) time.Duration) []string {
	var newest time.Time
	for _, at := range proofs {
		if at.After(newest) {
			newest = at
		}
	}
	var changed []string
	for cluster, at := range proofs {
		after := silentAfter(cluster)
		drain := after > 0 && cluster != self && newest.Sub(at) > after
		_, was := silent[cluster]
		switch {
		case drain && !was:
			silent[cluster] = at
			changed = append(changed, cluster)
		case !drain && was:
			delete(silent, cluster)
			changed = append(changed, cluster)
		}
	}
	for cluster := range silent {
		if _, ok := proofs[cluster]; !ok {
			delete(silent, cluster)
			changed = append(changed, cluster)
		}
	}
	return changed
}

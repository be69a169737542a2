package replication

import (
	"maps"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// GCPolicy says which replicas' sources still count.
type GCPolicy struct {
	Cluster string            // ours: never collected
	Peer    func(string) bool // configured in the peers directory (up or down)
	InScope func(string) bool // namespaces replicated
	Grace   time.Duration     // how long a source may be absent
}

// CollectGone decides which replicas (Services and EndpointSlices labelled
// with their source cluster) go: those whose source has been absent from
// the peers directory for the grace period. A source that is configured,
// even while down, is never absent. absent is when each source was first
// seen absent; the returned map replaces it (sources no longer seen are
// dropped, so one that comes back starts over). When every source of the
// replicas is absent at once (the peers Secret emptied or mis-keyed, not
// peers leaving one by one), nothing goes: held names them.
func CollectGone(objs []client.Object, p GCPolicy, absent map[string]time.Time, now time.Time) (del []client.Object, next map[string]time.Time, held []string) {
	next = map[string]time.Time{}
	present := false
	for _, o := range objs {
		from := o.GetLabels()[LabelSourceCluster]
		if from == "" || from == p.Cluster || !p.InScope(o.GetNamespace()) {
			continue
		}
		if p.Peer(from) {
			present = true
			continue
		}
		since, ok := absent[from]
		if !ok {
			since = now
		}
		next[from] = since
		if now.Sub(since) >= p.Grace {
			del = append(del, o)
		}
	}
	if !present && len(del) > 0 {
		held = slices.Sorted(maps.Keys(next))
		del = nil
	}
	return del, next, held
}

// ResyncKeys are the Service names to reconcile on a full resync: each
// one held by any cluster, in scope, once.
func ResyncKeys(held [][]corev1.Service, inScope func(string) bool) []ktypes.NamespacedName {
	seen := map[ktypes.NamespacedName]bool{}
	var out []ktypes.NamespacedName
	for _, svcs := range held {
		for i := range svcs {
			k := client.ObjectKeyFromObject(&svcs[i])
			if !seen[k] && inScope(k.Namespace) {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

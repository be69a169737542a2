package imports

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/clustermap/clustermap/internal/locality"
)

// How the planned objects replace what a cluster holds: in which order,
// and what of a derived Service can change in place.

// sliceStep is one write of an import's EndpointSlices: apply want (have:
// the slice of that name held now, if any), or delete drop.
type sliceStep struct {
	want, have *discoveryv1.EndpointSlice
	drop       *discoveryv1.EndpointSlice
}

// sliceOrder is every write that makes the slices held (have) the planned
// ones (want), those that take traffic from an endpoint first: between two
// writes kube-proxy then routes to fewer endpoints, never to dying ones
// beside their replacements (on failover, cluster A's slice turns unready
// before cluster B's is hinted for the zone). A slice that stays as it is
// is in the list too; applying it writes nothing.
func sliceOrder(have []discoveryv1.EndpointSlice, want []*discoveryv1.EndpointSlice) []sliceStep {
	held := map[string]*discoveryv1.EndpointSlice{}
	for i := range have {
		held[have[i].Name] = &have[i]
	}
	var narrowing, rest []sliceStep
	var wanted []discoveryv1.Endpoint
	for _, s := range want {
		wanted = append(wanted, s.Endpoints...)
		cur := held[s.Name]
		delete(held, s.Name)
		step := sliceStep{want: s, have: cur}
		if cur != nil && narrows(cur.Endpoints, s.Endpoints) {
			narrowing = append(narrowing, step)
		} else {
			rest = append(rest, step)
		}
	}
	// A slice renamed (its ports changed) goes after its replacement.
	for _, h := range have {
		s := held[h.Name]
		if s == nil {
			continue
		}
		if narrows(s.Endpoints, wanted) {
			narrowing = append(narrowing, sliceStep{drop: s})
		} else {
			rest = append(rest, sliceStep{drop: s})
		}
	}
	return append(narrowing, rest...)
}

// narrows reports whether endpoints to take traffic from some endpoint of
// from: its address gone, no longer one kube-proxy routes to, or hinted for
// fewer zones (no hints is every zone).
func narrows(from, to []discoveryv1.Endpoint) bool {
	const anyZone = ""
	routes := func(eps []discoveryv1.Endpoint) map[[2]string]bool {
		out := map[[2]string]bool{}
		for _, ep := range eps {
			c := ep.Conditions
			// kube-proxy's choice: ready ones, else serving terminating ones.
			if !ptr.Deref(c.Ready, true) && !(ptr.Deref(c.Serving, false) && ptr.Deref(c.Terminating, false)) {
				continue
			}
			for _, a := range ep.Addresses {
				if ep.Hints == nil {
					out[[2]string{a, anyZone}] = true
					continue
				}
				for _, z := range ep.Hints.ForZones {
					if z.Name != locality.Nowhere { // a zone no node is in
						out[[2]string{a, z.Name}] = true
					}
				}
			}
		}
		return out
	}
	now := routes(to)
	for r := range routes(from) {
		if !now[r] && !now[[2]string{r[0], anyZone}] {
			return true
		}
	}
	return false
}

// recreates says a derived Service must be made anew to be as planned:
// its first IP family (that of its VIP) cannot change in place.
func recreates(have, want *corev1.Service) bool {
	families := want.Spec.IPFamilies
	return len(families) > 0 && (len(have.Spec.IPFamilies) == 0 || !slices.Contains(families, have.Spec.IPFamilies[0]))
}

// inPlace is the planned derived Service as applied over the one held:
// the families it has, its first kept, the second the API server's to add
// (PreferDualStack, where the cluster has that family) or to drop
// (SingleStack). Planned families go only into a new Service.
func inPlace(have, want *corev1.Service) *corev1.Service {
	out := want.DeepCopy()
	if len(want.Spec.IPFamilies) == 0 {
		return out
	}
	out.Spec.IPFamilies = have.Spec.IPFamilies
	if ptr.Deref(want.Spec.IPFamilyPolicy, "") == corev1.IPFamilyPolicySingleStack && len(have.Spec.IPFamilies) > 1 {
		out.Spec.IPFamilies = have.Spec.IPFamilies[:1]
	}
	return out
}

package imports

import (
	"encoding/json"
	"time"

	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// JoinedAnnotation is, on an import, each exporting cluster and when this
// cluster first saw it export the Service, in Unix milliseconds: 0 for
// those it found exporting when it first imported the Service (or when
// this annotation was first written). The oldest export wins a conflict,
// and a creation time is what the exporter says; a cluster that joins
// later cannot claim to be much older than its joining, so that a newcomer's
// backdated ServiceExport wins nothing.
const JoinedAnnotation = "clustermap.io/exporters-joined"

// joinGrace is how much older than its joining a newcomer's export may
// be: honest exports made at about the same time reach this cluster in
// any order (operations, read lag, throttled bulk writes of a cluster
// just installed), and the older must still win. A newcomer can at most
// win against exporters that joined less than joinGrace before it.
const joinGrace = 15 * time.Minute

// joinedExporters clamps the exports' creation times to joinGrace
// before their clusters joined the import have (nil: not created yet), and returns the
// annotation's new value. A cluster absent from it and from have's
// clusters is new now. synced says the exports are all there are: only
// then are clusters that stopped exporting forgotten (after a restart, a
// Region not read yet must not make its clusters newcomers).
func joinedExporters(have *mcsv1beta1.ServiceImport, exports []registry.Export, synced bool, now time.Time) ([]registry.Export, string) {
	joined := map[string]int64{}
	var raw string
	if have != nil {
		raw = have.Annotations[JoinedAnnotation]
	}
	trustAll := have == nil
	if raw == "" || json.Unmarshal([]byte(raw), &joined) != nil {
		// A new import, or one from before this annotation: its clusters
		// so far are trusted as they were.
		joined = map[string]int64{}
		if have != nil {
			for _, c := range have.Status.Clusters {
				joined[c.Cluster] = 0
			}
			// No cluster recorded: a status never written (a create whose
			// status update failed) proves no one new.
			trustAll = len(joined) == 0
		}
	}
	out := make([]registry.Export, len(exports))
	exporting := map[string]bool{}
	for i, e := range exports {
		exporting[e.Cluster] = true
		at, known := joined[e.Cluster]
		if !known {
			if !trustAll {
				at = now.UnixMilli()
			}
			joined[e.Cluster] = at
		}
		if floor := time.UnixMilli(at).Add(-joinGrace); at > 0 && e.Created.Before(floor) {
			e.Created = floor
		}
		out[i] = e
	}
	if synced {
		for c := range joined {
			if !exporting[c] {
				delete(joined, c)
			}
		}
	}
	b, _ := json.Marshal(joined) // map keys sorted: the same map, the same value
	return out, string(b)
}

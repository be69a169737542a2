package cloudmap

import (
	"fmt"
	"sort"
	"sync"

	"github.com/clustermap/clustermap/internal/registry"
)

// Formats decides how this cluster writes its endpoint records, from what
// the registry shows of the other clusters: packed once every one of them
// reads packed records (its service records say format 3 or later), per
// endpoint while any writes an older format or another controller's
// records (the AWS Cloud Map MCS controller), or when told to keep them
// for callers that read Cloud Map directly. A cluster that exports
// nothing shows nothing, and is not waited for.
type Formats struct {
	// Cluster is this cluster: its own records, written by the release
	// before, do not hold it back.
	Cluster string
	// PerEndpoint keeps the per-endpoint format whatever the others read.
	PerEndpoint bool
	// OnChoice, when set, hears each new choice (for clustermap status).
	OnChoice func(Choice)

	mu sync.Mutex
	// versions is, per service, each other cluster's record format (0 for
	// another controller's records).
	versions map[registry.Key]map[string]int
	synced   bool
	last     Choice
}

// Choice is how this cluster writes its endpoint records, and why.
type Choice struct {
	Packed bool
	// Known is false until the registry was read once: then a cluster
	// keeps each export in the format it has.
	Known bool
	Why   string
}

func (c Choice) String() string {
	format := "per-endpoint"
	if c.Packed {
		format = "packed"
	}
	return format + ": " + c.Why
}

// Tap returns sink, with Formats hearing what it hears.
func (f *Formats) Tap(sink registry.Sink) registry.Sink {
	return registry.SinkFuncs{
		OnSet: func(key registry.Key, exports []registry.Export) {
			f.set(key, exports)
			sink.Set(key, exports)
		},
		OnUnreadable: sink.Unreadable,
		OnSynced: func() {
			f.mu.Lock()
			f.synced = true
			f.mu.Unlock()
			f.Choose()
			sink.Synced()
		},
	}
}

func (f *Formats) set(key registry.Key, exports []registry.Export) {
	v := map[string]int{}
	for _, e := range exports {
		if e.Cluster != f.Cluster {
			v[e.Cluster] = e.RecordVersion
		}
	}
	f.mu.Lock()
	if f.versions == nil {
		f.versions = map[registry.Key]map[string]int{}
	}
	if len(v) == 0 {
		delete(f.versions, key)
	} else {
		f.versions[key] = v
	}
	synced := f.synced
	f.mu.Unlock()
	if synced {
		f.Choose()
	}
}

// Choose says how to write endpoint records now.
func (f *Formats) Choose() Choice {
	f.mu.Lock()
	c := f.choose()
	changed := c != f.last
	f.last = c
	f.mu.Unlock()
	if changed && f.OnChoice != nil {
		f.OnChoice(c)
	}
	return c
}

func (f *Formats) choose() Choice {
	if f.PerEndpoint {
		return Choice{Known: true, Why: "kept by --cloudmap-endpoint-records=per-endpoint, for callers that read Cloud Map directly"}
	}
	if !f.synced {
		return Choice{Why: "the registry is not read yet: each export keeps the format it has"}
	}
	oldest := map[string]int{}
	for _, byCluster := range f.versions {
		for cluster, v := range byCluster {
			if old, ok := oldest[cluster]; !ok || v < old {
				oldest[cluster] = v
			}
		}
	}
	clusters := make([]string, 0, len(oldest))
	for c := range oldest {
		clusters = append(clusters, c)
	}
	sort.Strings(clusters)
	for _, c := range clusters {
		switch v := oldest[c]; {
		case v == 0:
			return Choice{Known: true, Why: fmt.Sprintf("cluster %s writes another controller's records (the AWS Cloud Map MCS controller?), which read only per-endpoint records", c)}
		case v < packedVersion:
			return Choice{Known: true, Why: fmt.Sprintf("cluster %s writes record format %d (an older clustermap), which reads only per-endpoint records", c, v)}
		}
	}
	return Choice{Packed: true, Known: true, Why: fmt.Sprintf("every other cluster that exports (%d) reads packed records", len(clusters))}
}

package recordfmt

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
)

// Formats decides how this cluster writes its endpoint records, from what
// the registry shows of the other clusters: packed once every one of them
// reads packed records (its service records say format 3 or later), per
// endpoint while any writes an older format or another controller's
// records (the AWS Cloud Map MCS controller), or when told to keep them
// for callers that read Cloud Map directly. A cluster that exports
// nothing shows nothing, and is not waited for; nor is one drained as
// silent. The format switches at most once per FormatHold: a record that
// comes and goes (any member can write one) costs every cluster one
// rewrite of its exports, not one per flip. An export that does not fit
// per-endpoint records stays packed whatever the choice (Backend.publish).
type Formats struct {
	// Cluster is this cluster: its own records, written by the release
	// before, do not hold it back.
	Cluster string
	// PerEndpoint keeps the per-endpoint format whatever the others read.
	PerEndpoint bool
	// OnChoice, when set, hears each new choice (for clustermap status);
	// switched says the format itself changed (every export is written
	// again then), not only why.
	OnChoice func(c Choice, switched bool)
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time

	mu sync.Mutex
	// versions is, per service, each other cluster's record format (0 for
	// another controller's records); exporting counts each other cluster's
	// services, and old its services per format that reads no packed
	// records: kept as services are told, so that choosing costs one
	// look per cluster, not per service.
	versions  map[registry.Key]map[string]int
	exporting map[string]int
	old       map[string]map[int]int
	synced    bool
	// last is the choice last made; it stands until what it was made
	// from changes (stale).
	last  Choice
	stale bool
	// switched is when the format last switched; recheck re-chooses once
	// a switch held back may go.
	switched time.Time
	recheck  *time.Timer
}

// FormatHold is the least time between two switches of the format.
const FormatHold = 5 * time.Minute

// Choice is how this cluster writes its endpoint records, and why.
type Choice struct {
	Packed bool
	// Known is false until the registry was read once: then a cluster
	// keeps each export in the format it has.
	Known bool
	Why   string
	// Behind are the clusters that read only per-endpoint records.
	Behind string
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
			f.synced, f.stale = true, true
			f.mu.Unlock()
			f.Choose()
			sink.Synced()
		},
	}
}

func (f *Formats) set(key registry.Key, exports []registry.Export) {
	v := map[string]int{}
	for _, e := range exports {
		if e.Cluster != f.Cluster && e.Silent.IsZero() {
			v[e.Cluster] = e.RecordVersion
		}
	}
	f.mu.Lock()
	if f.versions == nil {
		f.versions, f.exporting, f.old = map[registry.Key]map[string]int{}, map[string]int{}, map[string]map[int]int{}
	}
	f.count(f.versions[key], -1)
	f.count(v, 1)
	if len(v) == 0 {
		delete(f.versions, key)
	} else {
		f.versions[key] = v
	}
	f.stale = true
	synced := f.synced
	f.mu.Unlock()
	if synced {
		f.Choose()
	}
}

// count adds (or with -1 takes away) one service's formats by cluster.
func (f *Formats) count(byCluster map[string]int, by int) {
	for cluster, v := range byCluster {
		if f.exporting[cluster] += by; f.exporting[cluster] == 0 {
			delete(f.exporting, cluster)
		}
		if v >= PackedVersion {
			continue
		}
		if f.old[cluster] == nil {
			f.old[cluster] = map[int]int{}
		}
		if f.old[cluster][v] += by; f.old[cluster][v] == 0 {
			delete(f.old[cluster], v)
		}
		if len(f.old[cluster]) == 0 {
			delete(f.old, cluster)
		}
	}
}

// Choose says how to write endpoint records now.
func (f *Formats) Choose() Choice {
	f.mu.Lock()
	c := f.last
	if f.stale || c.Why == "" {
		c = f.hold(f.choose())
	}
	changed := c != f.last
	switched := c.Packed != f.last.Packed || c.Known != f.last.Known
	f.last, f.stale = c, false
	f.mu.Unlock()
	if changed && f.OnChoice != nil {
		f.OnChoice(c, switched)
	}
	return c
}

// hold keeps the format c would switch from within FormatHold of the last
// switch, and has it chosen again then.
func (f *Formats) hold(c Choice) Choice {
	if !f.last.Known || !c.Known || c.Packed == f.last.Packed {
		return c
	}
	now := time.Now()
	if f.Now != nil {
		now = f.Now()
	}
	wait := f.switched.Add(FormatHold).Sub(now)
	if f.switched.IsZero() || wait <= 0 {
		f.switched = now
		if f.recheck != nil {
			f.recheck.Stop()
			f.recheck = nil
		}
		return c
	}
	if f.recheck == nil {
		f.recheck = time.AfterFunc(wait, func() {
			f.mu.Lock()
			f.stale, f.recheck = true, nil
			f.mu.Unlock()
			f.Choose()
		})
	}
	held := f.last
	held.Why = fmt.Sprintf("kept until %s (the format switches at most once per %v; it switched at %s), though now %s",
		f.switched.Add(FormatHold).UTC().Format(time.RFC3339), FormatHold, f.switched.UTC().Format(time.RFC3339), c.Why)
	return held
}

func (f *Formats) choose() Choice {
	if f.PerEndpoint {
		return Choice{Known: true, Why: "kept by --cloudmap-endpoint-records=per-endpoint, for callers that read Cloud Map directly"}
	}
	if !f.synced {
		return Choice{Why: "the registry is not read yet: each export keeps the format it has"}
	}
	if len(f.old) > 0 {
		// The first by name, in its oldest format: one to name.
		behind := slices.Sorted(maps.Keys(f.old))
		c := behind[0]
		v := slices.Min(slices.Collect(maps.Keys(f.old[c])))
		if v == 0 {
			return Choice{Known: true, Behind: strings.Join(behind, ", "), Why: fmt.Sprintf("cluster %s writes another controller's records (the AWS Cloud Map MCS controller?), which read only per-endpoint records", c)}
		}
		return Choice{Known: true, Behind: strings.Join(behind, ", "), Why: fmt.Sprintf("cluster %s writes record format %d (an older clustermap), which reads only per-endpoint records", c, v)}
	}
	return Choice{Packed: true, Known: true, Why: fmt.Sprintf("every other cluster that exports (%d) reads packed records", len(f.exporting))}
}

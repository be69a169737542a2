package cloudmap

import (
	"hash/maphash"
	"slices"
	"sort"
	"time"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// decodeCache keeps each service's last decode, per cluster, with a sum of
// the records it was decoded from: a read decodes again only the clusters
// whose records changed, so a pod change in one of 50 clusters costs one
// cluster's decode, not 50. The sum is seeded per process, so that a
// writer cannot make records that collide with those read before.
type decodeCache struct {
	seed     maphash.Seed
	services map[registry.Key]map[string]clusterDecode
	// maxEndpoints caps each cluster's endpoints (recordfmt.DecodeAt).
	maxEndpoints int
	// decodes counts clusters decoded (not taken from the cache).
	decodes int
}

// clusterDecode is one cluster's records of a service, decoded: its export
// (none when no record of it is accepted) and the records that make none.
type clusterDecode struct {
	sum     uint64
	exports []registry.Export
	orphans []registry.InvalidRecord
}

func newDecodeCache(maxEndpoints int) *decodeCache {
	return &decodeCache{seed: maphash.MakeSeed(), services: map[registry.Key]map[string]clusterDecode{}, maxEndpoints: maxEndpoints}
}

// decode is recordfmt.DecodeAt, each cluster's part taken from the cache when its
// records are those decoded last time.
func (c *decodeCache) decode(key registry.Key, instances []recordfmt.Instance, now time.Time) ([]registry.Export, []registry.InvalidRecord) {
	groups := map[string][]recordfmt.Instance{}
	for _, in := range instances {
		cluster := in.Attrs[recordfmt.AttrClusterID]
		groups[cluster] = append(groups[cluster], in)
	}
	prev, next := c.services[key], make(map[string]clusterDecode, len(groups))
	var out []registry.Export
	var orphans []registry.InvalidRecord
	for cluster, group := range groups {
		sum := c.sum(group)
		d, ok := prev[cluster]
		if !ok || d.sum != sum {
			d.sum = sum
			d.exports, d.orphans = recordfmt.DecodeAt(key, group, now, c.maxEndpoints)
			c.decodes++
		}
		next[cluster] = d
		out = append(out, d.exports...)
		orphans = append(orphans, d.orphans...)
	}
	if len(next) == 0 {
		delete(c.services, key)
	} else {
		c.services[key] = next
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	sort.Slice(orphans, func(i, j int) bool { return orphans[i].ID < orphans[j].ID })
	if len(out) > 0 && len(orphans) > 0 {
		// Said on the first export, as recordfmt.DecodeAt does (the cached export
		// keeps its own list).
		invalid := append(slices.Clone(out[0].Invalid), orphans...)
		sort.Slice(invalid, func(i, j int) bool { return invalid[i].ID < invalid[j].ID })
		out[0].Invalid, orphans = registry.CapInvalid(invalid), nil
	}
	return out, orphans
}

// forget drops a service gone from Cloud Map.
func (c *decodeCache) forget(key registry.Key) {
	delete(c.services, key)
}

// sum is a cluster's records' sum, whatever order they are read in.
func (c *decodeCache) sum(group []recordfmt.Instance) uint64 {
	var total uint64
	for _, in := range group {
		var pairs uint64
		for k, v := range in.Attrs {
			pairs += maphash.String(c.seed, k+"\x00"+v)
		}
		var h maphash.Hash
		h.SetSeed(c.seed)
		h.WriteString(in.ID)
		var b [8]byte
		for i := range b {
			b[i] = byte(pairs >> (8 * i))
		}
		h.Write(b[:])
		total += h.Sum64()
	}
	return total
}

package cloudmap

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/cloudmap/recordfmt"
)

// DefaultNamespaceQuota is Cloud Map's default quota of instances per
// namespace, which accounts may have raised (--cloudmap-namespace-instance-quota).
const DefaultNamespaceQuota = 2000

// Usage is what the clusterset holds in Cloud Map, in instances per
// service as its watchers last read them, against the quotas: exports
// that would pass a quota are refused before anything is written, and
// operators see the headroom (metrics, clustermap status). Instances of
// other clustersets or of ECS in the same service or namespace count
// against the quotas too and are not seen here.
type Usage struct {
	// NamespaceQuota is the account's quota of instances per namespace.
	NamespaceQuota int

	mu sync.Mutex
	// counts are instances per service, by Region; holders the same by
	// the cluster they claim (CLUSTER_ID; "" none): whose junk fills a
	// quota is named, not only that it is full.
	counts  map[string]map[registry.Key]int
	holders map[string]map[registry.Key]map[string]int
}

// NewUsage tracks instances against a namespace quota (0: the default).
func NewUsage(namespaceQuota int) *Usage {
	if namespaceQuota <= 0 {
		namespaceQuota = DefaultNamespaceQuota
	}
	return &Usage{NamespaceQuota: namespaceQuota, counts: map[string]map[registry.Key]int{}, holders: map[string]map[registry.Key]map[string]int{}}
}

// observe records a service's instances as read, by the cluster each
// claims (none, or nil: gone).
func (u *Usage) observe(region string, key registry.Key, byCluster map[string]int) {
	if u == nil {
		return
	}
	n := 0
	for _, c := range byCluster {
		n += c
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	byKey, held := u.counts[region], u.holders[region]
	if byKey == nil {
		byKey, held = map[registry.Key]int{}, map[registry.Key]map[string]int{}
		u.counts[region], u.holders[region] = byKey, held
	}
	if n == 0 {
		delete(byKey, key)
		delete(held, key)
	} else {
		byKey[key], held[key] = n, byCluster
	}
}

// holder names who holds instances: the cluster they claim and, across
// accounts, the account that wrote them.
func holder(cluster, account string) string {
	if account == "" {
		return cluster
	}
	return cmp.Or(cluster, noCluster) + " (account " + account + ")"
}

const noCluster = "(no cluster)"

// topHolders is the holders of most of what keys hold, at most
// maxHolders of them, most first, and how many others hold some; callers
// hold u.mu.
func (u *Usage) topHolders(region string, in func(registry.Key) bool) (top []held, others int) {
	sum := map[string]int{}
	for k, byCluster := range u.holders[region] {
		if in(k) {
			for c, n := range byCluster {
				sum[cmp.Or(c, noCluster)] += n
			}
		}
	}
	names := slices.SortedFunc(maps.Keys(sum), func(a, b string) int { return cmp.Or(sum[b]-sum[a], strings.Compare(a, b)) })
	for _, c := range names[:min(len(names), maxHolders)] {
		top = append(top, held{c, sum[c]})
	}
	return top, len(names) - len(top)
}

// maxHolders bounds the holders named: a line of status, and the series
// of a namespace.
const maxHolders = 3

type held struct {
	holder    string
	instances int
}

// heldBy names the holders of most of what keys hold, most first; callers
// hold u.mu.
func (u *Usage) heldBy(region string, in func(registry.Key) bool) string {
	top, others := u.topHolders(region, in)
	var parts []string
	for _, h := range top {
		parts = append(parts, fmt.Sprintf("%s %d", h.holder, h.instances))
	}
	if others > 0 {
		parts = append(parts, fmt.Sprintf("%d more", others))
	}
	return strings.Join(parts, ", ")
}

// fits says why an export that changes a service's instances from have
// to want (this cluster's) would pass a quota; "" when it fits.
func (u *Usage) fits(region string, key registry.Key, have, want int) string {
	after := want - have
	inNamespace := after
	if u != nil {
		u.mu.Lock()
		after += u.counts[region][key]
		for k, n := range u.counts[region] {
			if k.Namespace == key.Namespace {
				inNamespace += n
			}
		}
		u.mu.Unlock()
	}
	after = max(after, want)
	switch {
	case after > recordfmt.MaxInstances:
		return fmt.Sprintf("Cloud Map service %s would hold %d instances (this cluster's %d of them), past Cloud Map's fixed quota of %d per service: nothing of this export was written; "+
			"write packed records (--cloudmap-endpoint-records=packed, and every cluster on a release that reads them), or export fewer endpoints (docs/scale.md)", key, after, want, recordfmt.MaxInstances)
	case u != nil && inNamespace > u.NamespaceQuota:
		return fmt.Sprintf("Cloud Map namespace %s would hold %d instances, past the account's quota of %d per namespace: nothing of this export was written; "+
			"ask AWS for a higher quota and set --cloudmap-namespace-instance-quota to it (docs/scale.md)", key.Namespace, inNamespace, u.NamespaceQuota)
	}
	return ""
}

// Fullest is the service and the namespace nearest their quotas.
type Fullest struct {
	Service            registry.Key
	ServiceInstances   int
	Namespace          string
	NamespaceInstances int
}

// namespaceUse is one namespace's instances, and its fullest service's.
type namespaceUse struct {
	instances        int
	fullest          registry.Key
	fullestInstances int
}

// byNamespace is each Region's instances by namespace; callers hold u.mu.
func (u *Usage) byNamespace() map[string]map[string]namespaceUse {
	out := map[string]map[string]namespaceUse{}
	for region, byKey := range u.counts {
		ns := map[string]namespaceUse{}
		for k, n := range byKey {
			use := ns[k.Namespace]
			use.instances += n
			if n > use.fullestInstances {
				use.fullest, use.fullestInstances = k, n
			}
			ns[k.Namespace] = use
		}
		out[region] = ns
	}
	return out
}

func (u *Usage) fullest() map[string]Fullest {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[string]Fullest{}
	for region, ns := range u.byNamespace() {
		var f Fullest
		for name, use := range ns {
			if use.fullestInstances > f.ServiceInstances {
				f.Service, f.ServiceInstances = use.fullest, use.fullestInstances
			}
			if use.instances > f.NamespaceInstances {
				f.Namespace, f.NamespaceInstances = name, use.instances
			}
		}
		out[region] = f
	}
	return out
}

// Summary is the headroom for clustermap status, naming who holds the
// fullest service's and namespace's instances.
func (u *Usage) Summary() string {
	var s string
	for region, f := range u.fullest() {
		if s != "" {
			s += "; "
		}
		u.mu.Lock()
		svc := u.heldBy(region, func(k registry.Key) bool { return k == f.Service })
		ns := u.heldBy(region, func(k registry.Key) bool { return k.Namespace == f.Namespace })
		u.mu.Unlock()
		s += fmt.Sprintf("%s: fullest service %s %d/%d instances (%s), fullest namespace %s %d/%d (%s)", region, f.Service, f.ServiceInstances, recordfmt.MaxInstances, svc,
			f.Namespace, f.NamespaceInstances, u.NamespaceQuota, ns)
	}
	return s
}

var (
	serviceInstancesDesc = prometheus.NewDesc("clustermap_cloudmap_service_instances",
		"Instances of this clusterset in each Cloud Map namespace's fullest service (the quota per service is 1,000, fixed), by Region.",
		[]string{"region", "cloudmap_namespace", "cloudmap_service"}, nil)
	namespaceInstancesDesc = prometheus.NewDesc("clustermap_cloudmap_namespace_instances",
		"Instances of this clusterset in each Cloud Map namespace, by Region.", []string{"region", "cloudmap_namespace"}, nil)
	holderInstancesDesc = prometheus.NewDesc("clustermap_cloudmap_namespace_holder_instances",
		"Instances in each Cloud Map namespace of its three largest holders, by Region: the cluster they claim and, across accounts, the account that wrote them (whose instances fill a quota).",
		[]string{"region", "cloudmap_namespace", "holder"}, nil)
	quotaDesc = prometheus.NewDesc("clustermap_cloudmap_instance_quota",
		"Cloud Map's quota of instances per service (fixed) and per namespace (--cloudmap-namespace-instance-quota).", []string{"scope"}, nil)
)

// Describe and Collect make Usage a Prometheus collector: one series per
// namespace, whatever the number of services.
func (u *Usage) Describe(ch chan<- *prometheus.Desc) {
	ch <- serviceInstancesDesc
	ch <- namespaceInstancesDesc
	ch <- holderInstancesDesc
	ch <- quotaDesc
}

func (u *Usage) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(quotaDesc, prometheus.GaugeValue, recordfmt.MaxInstances, "service")
	ch <- prometheus.MustNewConstMetric(quotaDesc, prometheus.GaugeValue, float64(u.NamespaceQuota), "namespace")
	u.mu.Lock()
	defer u.mu.Unlock()
	for region, ns := range u.byNamespace() {
		for name, use := range ns {
			ch <- prometheus.MustNewConstMetric(namespaceInstancesDesc, prometheus.GaugeValue, float64(use.instances), region, name)
			ch <- prometheus.MustNewConstMetric(serviceInstancesDesc, prometheus.GaugeValue, float64(use.fullestInstances), region, name, use.fullest.Name)
			top, _ := u.topHolders(region, func(k registry.Key) bool { return k.Namespace == name })
			for _, h := range top {
				ch <- prometheus.MustNewConstMetric(holderInstancesDesc, prometheus.GaugeValue, float64(h.instances), region, name, h.holder)
			}
		}
	}
}

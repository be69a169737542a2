package cloudmap

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/clustermap/clustermap/internal/registry"
)

// An export fits while its service stays within 1,000 instances and its
// namespace within the namespace quota, counting what the clusterset's
// other clusters hold there; a shrinking export always fits. The headroom
// is one series per namespace, and a line for clustermap status.
func TestUsage(t *testing.T) {
	u := NewUsage(1500)
	cart, web := registry.Key{Namespace: "shop", Name: "cart"}, registry.Key{Namespace: "shop", Name: "web"}
	u.observe("us-east-1", cart, map[string]int{"c1": 100, "c2": 200, "mallory": 400}) // 100 of them this cluster's
	u.observe("us-east-1", web, map[string]int{"c2": 600})
	for _, c := range []struct {
		key        registry.Key
		have, want int
		refused    string
	}{
		{cart, 100, 300, ""},                            // 900
		{cart, 100, 401, "would hold 1001 instances"},   // past the service quota
		{cart, 0, 1001, "would hold 1701 instances"},    // alone past it, whatever was read
		{web, 0, 199, ""},                               // namespace at 1,499
		{web, 0, 201, "namespace shop would hold 1501"}, // past the namespace quota
		{registry.Key{Namespace: "other", Name: "x"}, 0, 900, ""},
	} {
		why := u.fits("us-east-1", c.key, c.have, c.want)
		if c.refused == "" && why != "" || c.refused != "" && !strings.Contains(why, c.refused) {
			t.Errorf("%s from %d to %d: %q, want %q", c.key, c.have, c.want, why, c.refused)
		}
	}
	if s := u.Summary(); !strings.Contains(s, "fullest service shop/cart 700/1000 instances (mallory 400, c2 200, c1 100)") ||
		!strings.Contains(s, "fullest namespace shop 1300/1500 (c2 800, mallory 400, c1 100)") {
		t.Errorf("summary %q", s)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(u)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP clustermap_cloudmap_namespace_instances Instances of this clusterset in each Cloud Map namespace, by Region.
# TYPE clustermap_cloudmap_namespace_instances gauge
clustermap_cloudmap_namespace_instances{cloudmap_namespace="shop",region="us-east-1"} 1300
`), "clustermap_cloudmap_namespace_instances"); err != nil {
		t.Error(err)
	}
	// Whose instances fill the namespace: its three largest holders.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP clustermap_cloudmap_namespace_holder_instances Instances in each Cloud Map namespace of its three largest holders, by Region: the cluster they claim and, across accounts, the account that wrote them (whose instances fill a quota).
# TYPE clustermap_cloudmap_namespace_holder_instances gauge
clustermap_cloudmap_namespace_holder_instances{cloudmap_namespace="shop",holder="c1",region="us-east-1"} 100
clustermap_cloudmap_namespace_holder_instances{cloudmap_namespace="shop",holder="c2",region="us-east-1"} 800
clustermap_cloudmap_namespace_holder_instances{cloudmap_namespace="shop",holder="mallory",region="us-east-1"} 400
`), "clustermap_cloudmap_namespace_holder_instances"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(u, "clustermap_cloudmap_service_instances"); n != 1 {
		t.Errorf("%d service series for one namespace, want 1 (its fullest service)", n)
	}
	u.observe("us-east-1", cart, nil) // gone
	if why := u.fits("us-east-1", cart, 0, 900); why != "" {
		t.Errorf("a service gone still counts: %s", why)
	}
}

// Across accounts a holder is named by the account that wrote its
// instances too: a squatter may claim any cluster's name, or none.
func TestUsageNamesAccounts(t *testing.T) {
	u := NewUsage(0)
	key := registry.Key{Namespace: "shop", Name: "cart"}
	u.observe("eu-west-1", key, map[string]int{
		holder("c1", "111111111111"): 10, holder("c1", "999999999999"): 900, holder("", "999999999999"): 50, holder("c2", "222222222222"): 5, holder("c3", "333333333333"): 1,
	})
	want := "fullest service shop/cart 966/1000 instances (c1 (account 999999999999) 900, (no cluster) (account 999999999999) 50, c1 (account 111111111111) 10, 2 more)"
	if s := u.Summary(); !strings.Contains(s, want) {
		t.Errorf("summary %q, want it to hold %q", s, want)
	}
}

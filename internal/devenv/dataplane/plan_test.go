package dataplane

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func twoClusters() Fabric {
	return Fabric{Tag: "abc123", Subnet: 7, Nodes: []Node{
		{Cluster: "cluster-1", PodCIDRs: []string{"10.101.0.0/16", "fd00:10:101::/56"}},
		{Cluster: "cluster-2", PodCIDRs: []string{"fd00:10:102::/56"}},
	}}
}

func has(steps [][]string, want string) bool {
	return slices.ContainsFunc(steps, func(s []string) bool { return strings.Join(s, " ") == want })
}

func TestFabricRoutesEachClustersPodsToItsNode(t *testing.T) {
	f := twoClusters()
	steps := f.Steps()
	for _, want := range []string{
		"netns add cmabc123-fabric",
		"link add cmabc123 type veth peer name host netns cmabc123-fabric",
		"addr add 198.18.7.254/24 dev cmabc123",
		"-n cmabc123-cluster-1 addr add 198.18.7.1/24 dev eth0",
		"-n cmabc123-cluster-2 addr add fd00:198:18:7::2/64 dev eth0",
		// cluster-1 reaches cluster-2's only range through node 2's IPv6 address
		"-n cmabc123-cluster-1 route add fd00:10:102::/56 via fd00:198:18:7::2",
		"-n cmabc123-cluster-2 route add 10.101.0.0/16 via 198.18.7.1",
		"-n cmabc123-cluster-2 route add fd00:10:101::/56 via fd00:198:18:7::1",
		// pods reach the host's apiservers behind their node's address
		"netns exec cmabc123-cluster-1 nft add rule inet clustermap-dev to-host ip daddr 198.18.7.254 masquerade",
		"netns exec cmabc123-cluster-2 nft add rule inet clustermap-dev to-host ip6 daddr fd00:198:18:7::fe masquerade",
	} {
		if !has(steps, want) {
			t.Errorf("missing step %q", want)
		}
	}
	for _, s := range steps {
		j := strings.Join(s, " ")
		if strings.Contains(j, "route add") && strings.HasPrefix(j, "-n cmabc123-cluster-1 route add 10.101.") {
			t.Errorf("a node routes its own pods to the fabric: %q", j)
		}
		// Every name in the host's namespace fits IFNAMSIZ.
		if s[0] == "link" && s[1] == "add" && len(s[2]) > 15 {
			t.Errorf("link name %q is longer than 15 characters", s[2])
		}
	}
	// The node namespace exists before anything is put into it, and DAD is
	// off before its links are made.
	idx := func(want string) int {
		return slices.IndexFunc(steps, func(s []string) bool { return strings.Join(s, " ") == want })
	}
	if a, b := idx("netns add cmabc123-cluster-2"), idx("-n cmabc123-fabric link add n2 type veth peer name eth0 netns cmabc123-cluster-2"); a < 0 || b < a {
		t.Errorf("node namespace made at step %d, its link at %d", a, b)
	}
}

func TestPodStepsGiveEachFamilyAnAddressAndRoute(t *testing.T) {
	f := twoClusters()
	ips := []netip.Addr{netip.MustParseAddr("10.101.4.5"), netip.MustParseAddr("fd00:10:101:1::5")}
	p := f.PodOf("cluster-1", "demo", "nginx-0", ips)
	if !strings.HasPrefix(p.NetNS, f.Prefix()+"cluster-1-") || len(p.Link) > 15 {
		t.Fatalf("pod names %q / %q", p.NetNS, p.Link)
	}
	if again := f.PodOf("cluster-1", "demo", "nginx-0", nil); again.NetNS != p.NetNS {
		t.Errorf("the pod's namespace name is not derived from the pod alone: %q then %q", p.NetNS, again.NetNS)
	}
	if other := f.PodOf("cluster-2", "demo", "nginx-0", nil); other.NetNS == p.NetNS || other.Link == p.Link {
		t.Errorf("pods of the same name in two clusters share names")
	}
	steps := p.Steps("node")
	for _, want := range []string{
		"-n " + p.NetNS + " addr add 10.101.4.5/32 dev eth0",
		"-n " + p.NetNS + " addr add fd00:10:101:1::5/128 dev eth0",
		"-n node route add 10.101.4.5/32 dev " + p.Link,
		"-n node route add fd00:10:101:1::5/128 dev " + p.Link,
		"-n " + p.NetNS + " route add default via 169.254.1.1 dev eth0",
		"-n " + p.NetNS + " -6 route add default via fe80::1 dev eth0",
	} {
		if !has(steps, want) {
			t.Errorf("missing step %q", want)
		}
	}
	v6only := f.PodOf("cluster-2", "demo", "x", []netip.Addr{netip.MustParseAddr("fd00:10:102:1::9")}).Steps("node")
	for _, s := range v6only {
		if strings.Contains(strings.Join(s, " "), "169.254.1.1 dev eth0") && s[1] != "node" {
			t.Errorf("an IPv6-only pod gets an IPv4 route: %q", s)
		}
	}
}

func TestResolvConfNamesTheNodeInThePodsFamilies(t *testing.T) {
	f := twoClusters()
	const search = "search shop.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
	if got, want := f.ResolvConf(2, []netip.Addr{netip.MustParseAddr("fd00:10:102:1::9")}, "shop"), search+"nameserver fd00:198:18:7::2\n"; got != want {
		t.Errorf("IPv6-only pod: %q, want %q", got, want)
	}
	dual := f.ResolvConf(1, []netip.Addr{netip.MustParseAddr("fd00:10:101:1::9"), netip.MustParseAddr("10.101.4.9")}, "shop")
	if dual != search+"nameserver 198.18.7.1\n" {
		t.Errorf("dual-stack pod: %q", dual)
	}
}

func TestTagsDifferPerStateDirectory(t *testing.T) {
	if TagOf("/a/.clustermap/dev") == TagOf("/b/.clustermap/dev") || len(TagOf("/x")) != 6 {
		t.Errorf("tags: %q %q", TagOf("/a/.clustermap/dev"), TagOf("/b/.clustermap/dev"))
	}
}

func TestAnswerRoundTrips(t *testing.T) {
	a := ParseAnswer(Identity{Pod: "nginx-0", Namespace: "demo", Cluster: "cluster-1"}.Answer(80, "TCP"))
	if a["pod"] != "nginx-0" || a["cluster"] != "cluster-1" || a["port"] != "80/TCP" || a["namespace"] != "demo" {
		t.Errorf("parsed %v", a)
	}
}

// Package dataplane gives local clusters a real network: a node network
// namespace per cluster running kube-proxy and clustermap's DNS, a network
// namespace per pod holding the pod's addresses and a small server, and the
// clusters' pod ranges routed between the nodes as peered VPCs would be.
//
// The plans here are pure: they say which `ip` commands build what; the
// adapters in netns.go run them.
package dataplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Annotation asks for a data plane on a pod (on a Deployment's or
// StatefulSet's pod template): its own network namespace with its
// addresses, and the pod server answering on its container ports.
const Annotation = "dev.clustermap.io/dataplane"

// Fabric is the network of one environment: a bridge in its own namespace
// joining the clusters' nodes and, through an uplink, the host, where the
// apiservers listen.
type Fabric struct {
	// Tag names everything the environment makes: namespaces cm<tag>-*,
	// the host's uplink cm<tag>.
	Tag string `json:"tag"`
	// Subnet is the environment's transit network 198.18.<Subnet>.0/24
	// (and fd00:198:18:<Subnet>::/64): node i is .i, the host .254.
	Subnet int `json:"subnet"`
	// Nodes are the clusters, in order; node i+1 is Nodes[i].
	Nodes []Node `json:"nodes"`
}

// Node is one cluster's node namespace.
type Node struct {
	Cluster  string   `json:"cluster"`
	PodCIDRs []string `json:"podCIDRs"`
}

// MaxSubnets bounds the environments with a data plane on one machine.
const MaxSubnets = 250

// TagOf derives an environment's tag from its state directory: one
// environment per directory, so tags do not collide between environments.
func TagOf(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return hex.EncodeToString(sum[:])[:6]
}

// Prefix starts the name of every namespace of the environment.
func (f Fabric) Prefix() string { return "cm" + f.Tag + "-" }

// Uplink is the host's end of the link to the fabric.
func (f Fabric) Uplink() string { return "cm" + f.Tag }

// FabricNS is the namespace holding the bridge.
func (f Fabric) FabricNS() string { return f.Prefix() + "fabric" }

// NodeNS is the node namespace of a cluster.
func (f Fabric) NodeNS(cluster string) string { return f.Prefix() + cluster }

// HostAddr is the host's address on the fabric: node components reach the
// apiservers there.
func (f Fabric) HostAddr() netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(f.Subnet), 254}) }

// HostAddrs are the host's addresses on the fabric, IPv4 and IPv6: the
// apiservers reach an IPv6-only cluster's node (its kubelet API) from
// the second.
func (f Fabric) HostAddrs() []netip.Addr {
	return []netip.Addr{f.HostAddr(), netip.MustParseAddr(fmt.Sprintf("fd00:198:18:%x::fe", f.Subnet))}
}

// NodeAddrs are node i's (from 1) addresses on the fabric, IPv4 first.
func (f Fabric) NodeAddrs(i int) []netip.Addr {
	v6 := netip.MustParseAddr(fmt.Sprintf("fd00:198:18:%x::%x", f.Subnet, i))
	return []netip.Addr{netip.AddrFrom4([4]byte{198, 18, byte(f.Subnet), byte(i)}), v6}
}

// NodeIPs are node i's fabric addresses of its cluster's families.
func (f Fabric) NodeIPs(i int) []netip.Addr {
	var out []netip.Addr
	for _, a := range f.NodeAddrs(i) {
		if slices.ContainsFunc(f.Nodes[i-1].PodCIDRs, func(c string) bool { return strings.Contains(c, ":") == a.Is6() }) {
			out = append(out, a)
		}
	}
	return out
}

// NodeIndex finds a cluster's node number (from 1), or 0.
func (f Fabric) NodeIndex(cluster string) int {
	for i, n := range f.Nodes {
		if n.Cluster == cluster {
			return i + 1
		}
	}
	return 0
}

// noDAD turns off duplicate address detection in a namespace before its
// links are made: addresses are ours alone, and DAD would hold each new
// IPv6 address unusable for a second or two.
func noDAD(ns string) []string {
	return []string{"netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"}
}

// Steps builds the fabric, the uplink and every node namespace with its
// routes to the other clusters' pods. Each step is the arguments of one
// `ip` command.
func (f Fabric) Steps() [][]string {
	fab, up := f.FabricNS(), f.Uplink()
	steps := [][]string{
		{"netns", "add", fab},
		noDAD(fab),
		{"-n", fab, "link", "add", "br0", "type", "bridge"},
		{"-n", fab, "link", "set", "br0", "up"},
		{"link", "add", up, "type", "veth", "peer", "name", "host", "netns", fab},
		{"-n", fab, "link", "set", "host", "master", "br0"},
		{"-n", fab, "link", "set", "host", "up"},
		{"addr", "add", f.HostAddr().String() + "/24", "dev", up},
		{"addr", "add", f.HostAddrs()[1].String() + "/64", "dev", up, "nodad"},
		{"link", "set", up, "up"},
	}
	for i, n := range f.Nodes {
		ns, port := f.NodeNS(n.Cluster), fmt.Sprintf("n%d", i+1)
		steps = append(steps,
			[]string{"netns", "add", ns},
			noDAD(ns),
			[]string{"netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"},
			[]string{"-n", fab, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"-n", fab, "link", "set", port, "master", "br0"},
			[]string{"-n", fab, "link", "set", port, "up"},
			[]string{"-n", ns, "link", "set", "lo", "up"},
		)
		for _, a := range f.NodeAddrs(i + 1) {
			steps = append(steps, []string{"-n", ns, "addr", "add", prefixOf(a, 24, 64), "dev", "eth0"})
		}
		steps = append(steps, []string{"-n", ns, "link", "set", "eth0", "up"})
		steps = append(steps, f.toHost(ns)...)
		for j, peer := range f.Nodes {
			if j == i {
				continue
			}
			via := f.NodeAddrs(j + 1)
			for _, cidr := range peer.PodCIDRs {
				gw := via[0]
				if strings.Contains(cidr, ":") {
					gw = via[1]
				}
				steps = append(steps, []string{"-n", ns, "route", "add", cidr, "via", gw.String()})
			}
		}
	}
	return steps
}

// toHost masquerades what a node's pods send to the host behind the node's
// fabric address: pods reach the apiserver there (their in-cluster
// configuration), and the host has no route back to pod ranges, which
// may overlap between environments.
func (f Fabric) toHost(ns string) [][]string {
	nft := func(args ...string) []string { return append([]string{"netns", "exec", ns, "nft"}, args...) }
	return [][]string{
		nft("add", "table", "inet", "clustermap-dev"),
		nft("add", "chain", "inet", "clustermap-dev", "to-host", "{ type nat hook postrouting priority srcnat; }"),
		nft("add", "rule", "inet", "clustermap-dev", "to-host", "ip", "daddr", f.HostAddrs()[0].String(), "masquerade"),
		nft("add", "rule", "inet", "clustermap-dev", "to-host", "ip6", "daddr", f.HostAddrs()[1].String(), "masquerade"),
	}
}

func prefixOf(a netip.Addr, bits4, bits6 int) string {
	if a.Is4() {
		return netip.PrefixFrom(a, bits4).String()
	}
	return netip.PrefixFrom(a, bits6).String()
}

// Pod is a pod's network namespace, attached to its cluster's node.
type Pod struct {
	// NetNS is the pod's namespace; Link the node's end of its veth.
	NetNS, Link string
	IPs         []netip.Addr
}

// PodOf names a pod's namespace and link, derived from the pod's
// namespace and name.
func (f Fabric) PodOf(cluster, namespace, name string, ips []netip.Addr) Pod {
	sum := sha256.Sum256([]byte(cluster + "/" + namespace + "/" + name))
	h := hex.EncodeToString(sum[:])[:10]
	return Pod{NetNS: f.Prefix() + cluster + "-" + h, Link: "p" + h, IPs: ips}
}

// The pod's gateways: the node's end of every pod link answers for them,
// as a cloud VPC's router does, so pods need no per-node configuration.
var (
	gateway4 = netip.MustParseAddr("169.254.1.1")
	gateway6 = netip.MustParseAddr("fe80::1")
)

// Steps builds a pod's namespace inside node namespace node: a veth whose
// pod end holds the pod's addresses with a default route per family
// through the node, whose node end routes them.
func (p Pod) Steps(node string) [][]string {
	steps := [][]string{
		{"netns", "add", p.NetNS},
		noDAD(p.NetNS),
		{"-n", node, "link", "add", p.Link, "type", "veth", "peer", "name", "eth0", "netns", p.NetNS},
		{"-n", node, "addr", "add", gateway4.String() + "/32", "dev", p.Link},
		{"-n", node, "addr", "add", gateway6.String() + "/64", "dev", p.Link},
		{"-n", node, "link", "set", p.Link, "up"},
		{"-n", p.NetNS, "link", "set", "lo", "up"},
		{"-n", p.NetNS, "link", "set", "eth0", "up"},
	}
	var has4, has6 bool
	for _, ip := range p.IPs {
		steps = append(steps,
			[]string{"-n", p.NetNS, "addr", "add", prefixOf(ip, 32, 128), "dev", "eth0"},
			[]string{"-n", node, "route", "add", prefixOf(ip, 32, 128), "dev", p.Link})
		has4, has6 = has4 || ip.Is4(), has6 || ip.Is6()
	}
	if has4 {
		steps = append(steps,
			[]string{"-n", p.NetNS, "route", "add", gateway4.String(), "dev", "eth0", "scope", "link"},
			[]string{"-n", p.NetNS, "route", "add", "default", "via", gateway4.String(), "dev", "eth0"})
	}
	if has6 {
		steps = append(steps, []string{"-n", p.NetNS, "-6", "route", "add", "default", "via", gateway6.String(), "dev", "eth0"})
	}
	return steps
}

// ClustermapDNS is where clustermap's DNS server listens in a node
// namespace: the node's CoreDNS forwards clusterset.local to it.
const ClustermapDNS = "127.0.0.1:5353"

// Corefile configures a node's CoreDNS as a cluster's DNS is: the
// cluster's own names from its apiserver, clusterset.local forwarded to
// clustermap's DNS server (the stub domain the docs describe).
func Corefile(kubeconfig string) string {
	return fmt.Sprintf(`.:53 {
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
}
clusterset.local:53 {
    errors
    forward . %s
}
`, kubeconfig, ClustermapDNS)
}

// ResolvConf is a pod's /etc/resolv.conf, as a kubelet writes it for
// dnsPolicy ClusterFirst: its node's DNS at the node's fabric address
// (IPv4 when the pod has it), the search path of its namespace.
func (f Fabric) ResolvConf(node int, ips []netip.Addr, namespace string) string {
	addrs := f.NodeAddrs(node)
	var b strings.Builder
	fmt.Fprintf(&b, "search %s.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n", namespace)
	// One nameserver, as a kubelet writes the cluster DNS's one address:
	// resolvers try a second one on every answer without the RA flag,
	// which the cluster's own names never carry.
	ns := addrs[1]
	if slices.ContainsFunc(ips, netip.Addr.Is4) {
		ns = addrs[0]
	}
	fmt.Fprintf(&b, "nameserver %s\n", ns)
	return b.String()
}

// Command coredns is CoreDNS with only the plugins a dev cluster's node
// needs: the cluster's own names (kubernetes) and clusterset.local
// forwarded to clustermap's DNS server (forward), as in a real cluster,
// and cache, which the documented clusterset.local block uses.
// Stock CoreDNS builds every plugin (cloud providers' SDKs among them).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() {
	// The order plugins see a query in, as in CoreDNS's plugin.cfg.
	dnsserver.Directives = []string{"errors", "cache", "kubernetes", "forward"}
}

func main() { coremain.Run() }

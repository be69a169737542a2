//go:build e2e

package dataplane

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// newFabric builds a real fabric of two dual-stack clusters, removed when
// the test ends; it checks that nothing of it is left.
func newFabric(t *testing.T) Fabric {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the data plane makes network namespaces: run the tests as root")
	}
	f := Fabric{Tag: TagOf(t.TempDir()), Nodes: []Node{
		{Cluster: "cluster-1", PodCIDRs: []string{"10.101.0.0/16", "fd00:10:101::/56"}},
		{Cluster: "cluster-2", PodCIDRs: []string{"10.102.0.0/16", "fd00:10:102::/56"}},
	}}
	ctx := context.Background()
	t.Cleanup(func() {
		if err := Teardown(ctx, f.Tag); err != nil {
			t.Errorf("teardown: %v", err)
		}
		if left := Leftovers(f.Tag); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	})
	if err := f.Build(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

func addPod(t *testing.T, f Fabric, cluster, name string, ips ...string) Pod {
	t.Helper()
	var addrs []netip.Addr
	for _, ip := range ips {
		addrs = append(addrs, netip.MustParseAddr(ip))
	}
	p := f.PodOf(cluster, "demo", name, addrs)
	if err := Run(context.Background(), p.Steps(f.NodeNS(cluster))); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPodsOfTwoClustersTalkOverTheFabric: a pod server in cluster-1 answers
// a client in cluster-2 over both families, through the routes between
// the node namespaces, without NAT.
func TestPodsOfTwoClustersTalkOverTheFabric(t *testing.T) {
	f := newFabric(t)
	server := addPod(t, f, "cluster-1", "server", "10.101.4.5", "fd00:10:101:1::5")
	client := addPod(t, f, "cluster-2", "client", "10.102.4.9", "fd00:10:102:1::9")

	var l net.Listener
	if err := InNS(server.NetNS, func() (err error) { l, err = net.Listen("tcp", ":80"); return err }); err != nil {
		t.Fatal(err)
	}
	id := Identity{Pod: "server", Namespace: "demo", Cluster: "cluster-1"}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, id.Answer(80, "TCP")) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })

	for _, addr := range []string{"10.101.4.5", "fd00:10:101:1::5"} {
		var conn net.Conn
		if err := InNS(client.NetNS, func() (err error) {
			conn, err = net.DialTimeout("tcp", net.JoinHostPort(addr, "80"), 5*time.Second)
			return err
		}); err != nil {
			t.Fatalf("client in cluster-2 dialing %s: %v", addr, err)
		}
		tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil }}
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://" + net.JoinHostPort(addr, "80"))
		if err != nil {
			t.Fatalf("GET %s: %v", addr, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := ParseAnswer(string(body)); got["pod"] != "server" || got["cluster"] != "cluster-1" {
			t.Errorf("%s answered %q", addr, body)
		}
		// The server saw the client's own address: no NAT between clusters.
		if local := conn.LocalAddr().(*net.TCPAddr).IP.String(); !strings.HasPrefix(local, "10.102.4.9") && local != "fd00:10:102:1::9" {
			t.Errorf("client spoke from %s", local)
		}
	}
}

//go:build e2e

package soak

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/registry/hub"
	"github.com/clustermap/clustermap/test/harness"
)

// hubSide is a hub fleet's registry: a hub cluster the members reach
// through a partition, and each member's kubeconfig for it.
type hubSide struct {
	env         *devenv.Env
	admin       client.Client
	relay       *partition
	kubeconfigs map[string]string // member id -> the file its controllers read
}

// TestHubFaultCampaign is the campaign over a hub registry (MCS exports
// under churn and controller kills): the hub's API server restarts, the
// hub is cut off from every member, and a member's credentials are
// revoked and issued anew. Nothing may be lost or left.
func TestHubFaultCampaign(t *testing.T) {
	s := campaignSettings()
	f := startHub(t, s)
	f.campaign(t, s.hubDown+s.revoked, func() {
		f.phase(t, "hub apiserver restart", func() {
			c := f.hub.env.Clusters[0]
			harness.Must(t, f.hub.env.StopCluster(context.Background(), c))
			harness.Must(t, f.hub.env.StartCluster(context.Background(), c))
		})
		f.took(t, "hub unreachable", "no member sent the hub anything", func() float64 { return float64(f.hub.relay.held.Load()) }, func() {
			f.hub.relay.cut()
			time.Sleep(s.hubDown)
			f.hub.relay.heal()
		})
		// Refused writes and renewals: the member's exports wait, and no
		// one else drops it before its silence passes the TTL.
		f.took(t, "a member's credentials revoked", "no call of cluster 0 refused", func() float64 { return float64(f.refusals(0)) }, func() {
			harness.Must(t, hub.Leave(context.Background(), f.hub.admin, f.env.ClusterSet, f.ids[0]))
			time.Sleep(s.revoked)
			// Issued anew, as an operator rotates them: a new Secret, the
			// controllers restarted to read it.
			f.join(t, f.ids[0])
			for _, p := range f.ctrls[0] {
				p.Stop()
				p.Start()
			}
		})
	})
}

// startHub is a fleet whose registry is a hub cluster, MCS only.
func startHub(t *testing.T, s settings) *fleet {
	f, dir := newFleet(t, s, []kind{kindMCS})
	h := harness.Clusters(t, 1)
	c := h.Clusters[0]
	harness.Must(t, hub.Init(context.Background(), c.Config, f.env.ClusterSet))
	server, err := url.Parse(c.Server)
	harness.Must(t, err)
	f.hub = &hubSide{env: h, admin: harness.ClientWith(t, c.Config, hub.Scheme()), relay: relayTo(t, server.Host), kubeconfigs: map[string]string{}}
	for _, id := range f.ids {
		f.hub.kubeconfigs[id] = filepath.Join(dir, id+".hub.kubeconfig")
		f.join(t, id)
	}
	f.startControllers(t, dir, nil, func(c *devenv.Cluster) []string {
		return []string{"--registry", "hub", "--hub-kubeconfig", f.hub.kubeconfigs[c.ID], "--namespaces", nsMCS}
	})
	return f
}

// join issues a member's hub kubeconfig (clustermap hub join), through
// the partition.
func (f *fleet) join(t *testing.T, id string) {
	c := f.hub.env.Clusters[0]
	data, _, err := hub.Join(context.Background(), c.Config, f.env.ClusterSet, id, "", f.hub.relay.URL(), time.Hour)
	harness.Must(t, err)
	harness.Must(t, os.WriteFile(f.hub.kubeconfigs[id], data, 0o600))
}

// refusals counts the hub's refusals of cluster i's calls that its
// controllers logged.
func (f *fleet) refusals(i int) int {
	n := 0
	for _, p := range f.ctrls[i] {
		data, _ := os.ReadFile(p.Log)
		n += strings.Count(string(data), "Unauthorized")
	}
	return n
}

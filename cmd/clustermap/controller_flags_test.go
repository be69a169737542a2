package main

import (
	"strings"
	"testing"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/migrate"
)

// The registry flags are checked together: a migration names the other
// registry, the hub's kubeconfig is asked for exactly when a hub is read.
func TestRegistryFlags(t *testing.T) {
	for _, c := range []struct {
		kind, from, phase, hub string
		wantErr                string
		wantFrom               string
	}{
		{kind: "cloudmap", phase: "both"},
		{kind: "hub", phase: "both", hub: "k", wantErr: ""},
		{kind: "hub", phase: "both", wantErr: "needs --hub-kubeconfig"},
		{kind: "cloudmap", phase: "both", hub: "k", wantErr: "add --registry=hub"},
		{kind: "hub", from: "cloudmap", phase: "both", hub: "k", wantFrom: registry.CloudMap},
		{kind: "cloudmap", from: "hub", phase: "leaving", hub: "k", wantFrom: registry.Hub},
		{kind: "cloudmap", from: "hub", phase: "both", wantErr: "needs --hub-kubeconfig"},
		{kind: "hub", from: "hub", phase: "both", hub: "k", wantErr: "name the registry the clusterset moves from"},
		{kind: "hub", from: "etcd", phase: "both", hub: "k", wantErr: "cloudmap or hub"},
		{kind: "hub", from: "cloudmap", phase: "half", hub: "k", wantErr: "both or leaving"},
	} {
		o := controller.Options{HubKubeconfig: c.hub}
		err := registryFlags(&o, c.kind, c.from, c.phase)
		if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("%+v: error %v, want %q", c, err, c.wantErr)
		}
		if err == nil && (o.MigratingFrom != c.wantFrom || o.MigrationPhase != migrate.Phase(c.phase)) {
			t.Errorf("%+v: from %q phase %q", c, o.MigratingFrom, o.MigrationPhase)
		}
	}
}

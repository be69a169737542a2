package memory

import (
	"testing"

	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/registry/registrytest"
)

func TestRegistrySuite(t *testing.T) {
	registrytest.Run(t, func(*testing.T) registrytest.New {
		s := NewStore()
		return func(_ *testing.T, set, cluster string) registry.Registry { return s.Registry(set, cluster) }
	})
}

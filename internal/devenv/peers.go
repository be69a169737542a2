//go:build linux

// Peer kubeconfigs for the replication mode, granted as
// `clustermap peer-kubeconfig` grants them.

package devenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/replication"
)

// PeerDirs writes, for every cluster, a directory under root holding the
// kubeconfigs of the other clusters, named <id>.yaml: what
// `controller --syndicate --peers-dir` reads. Each grants what access says
// (For and Namespace filled in), as `clustermap peer-kubeconfig` does, for
// a day. It returns them by cluster id.
func (e *Env) PeerDirs(ctx context.Context, root string, access replication.PeerAccess) (map[string]string, error) {
	if access.Namespace == "" {
		access.Namespace = kube.DefaultStatusNamespace
	}
	dirs := map[string]string{}
	for _, c := range e.Clusters {
		dir := filepath.Join(root, c.ID)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		for _, peer := range e.Clusters {
			if peer == c {
				continue
			}
			access.For = c.ID
			data, _, err := replication.IssuePeerKubeconfig(ctx, peer.Config, peer.ID, "", access, 24*time.Hour)
			if err != nil {
				return nil, fmt.Errorf("access of %s to %s: %w", c.ID, peer.ID, err)
			}
			if err := os.WriteFile(filepath.Join(dir, peer.ID+".yaml"), data, 0o600); err != nil {
				return nil, err
			}
		}
		dirs[c.ID] = dir
	}
	return dirs, nil
}

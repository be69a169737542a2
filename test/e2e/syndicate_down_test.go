//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/test/harness"
)

// A controller that starts while a peer is down, and sees that peer's
// kubeconfig change meanwhile, keeps the peer's replicas (it counts the
// peer as down, not gone) and syncs it once it answers.
func TestSyndicatePeerDownAtStart(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	w.allNamespaces(t, "web")
	dirs, err := w.env.PeerDirs(context.Background(), t.TempDir(), replication.PeerAccess{Namespaces: []string{"web"}})
	harness.Must(t, err)
	const grace = 3 * time.Second // short, so that a wrong deletion shows within the test
	tune := func(o *controller.Options) {
		w.asPeer(o, dirs)
		o.MCS, o.Syndicate, o.PeerGrace = false, true, grace
		o.Namespaces = []string{"web"}
	}
	ctx := context.Background()
	stop := w.startControllers(t, tune)
	one, two := w.clients[0], w.clients[1]
	app(t, one, "web", "from1", 2, false, httpPort(80, 8080))
	app(t, two, "web", "from2", 2, false, httpPort(80, 8080))
	ips1, ips2 := waitPods(t, one, "web", "from1", 2), waitPods(t, two, "web", "from2", 2)
	harness.Eventually(t, importDeadline, "from1 in cluster-2", replicaOf(two, "web", "from1", "cluster-1", false, ips1))
	harness.Eventually(t, importDeadline, "from2 in cluster-1", replicaOf(one, "web", "from2", "cluster-2", false, ips2))

	// Both controllers stop; cluster-2's apiserver goes; cluster-1's
	// controller starts alone, and cluster-2's kubeconfig changes.
	stop()
	harness.Must(t, w.env.StopCluster(ctx, w.env.Clusters[1]))
	only1 := *w.env
	only1.Clusters = w.env.Clusters[:1]
	cctx, cancel := context.WithCancel(ctx)
	wait := only1.StartControllers(cctx, w.cm.URL, func(*devenv.Cluster) logr.Logger { return harness.HeldLog(t) }, func(o *controller.Options) {
		o.MetricsAddr = "0"
		tune(o)
	})
	stopped := false
	stop1 := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := wait(); err != nil {
				t.Errorf("cluster-1's controller: %v", err)
			}
		}
	}
	t.Cleanup(stop1)
	peerFile := filepath.Join(dirs["cluster-1"], "cluster-2.yaml")
	data, err := os.ReadFile(peerFile)
	harness.Must(t, err)
	start := time.Now()
	changed := false
	for time.Since(start) < 5*grace {
		harness.Must(t, replicaOf(one, "web", "from2", "cluster-2", false, ips2)())
		if !changed && time.Since(start) > grace {
			harness.Must(t, os.WriteFile(peerFile, append(data, []byte("\n# rotated while cluster-2 is down\n")...), 0o600))
			changed = true
		}
		time.Sleep(time.Second)
	}
	// clustermap status names the peer that is down.
	harness.Eventually(t, 30*time.Second, "status names cluster-2 unreachable", func() error {
		out, _ := statusOf(t, w, "table")
		if !strings.Contains(out, "peer unreachable: cluster-2") {
			return fmt.Errorf("status:\n%s", out)
		}
		return nil
	})

	// cluster-2 back, its controller too: both converge, a change made in
	// cluster-1 meanwhile included.
	harness.Scale(t, one, "web", "from1", 3)
	ips1 = waitPods(t, one, "web", "from1", 3)
	harness.Must(t, w.env.StartCluster(ctx, w.env.Clusters[1]))
	stop1()
	t.Cleanup(w.startControllers(t, tune))
	harness.Eventually(t, 60*time.Second, "cluster-2 converges once back", replicaOf(two, "web", "from1", "cluster-1", false, ips1))
	harness.Must(t, replicaOf(one, "web", "from2", "cluster-2", false, ips2)())

	// A kubeconfig that would run a command is refused: a Warning Event on
	// the status Lease names the file and the fix, the command never runs,
	// the peer counts as down and its replicas stay.
	cfg, err := clientcmd.Load(data)
	harness.Must(t, err)
	marker := filepath.Join(t.TempDir(), "ran")
	for _, u := range cfg.AuthInfos {
		u.Exec = &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh", Args: []string{"-c", "touch " + marker}, InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
	}
	harness.Must(t, clientcmd.WriteToFile(*cfg, peerFile))
	harness.Eventually(t, 30*time.Second, "PeerKubeconfigRefused Event", wantEvent(one, kube.DefaultStatusNamespace, statuslease.LeaseName,
		replication.ReasonPeerKubeconfigRefused, corev1.EventTypeWarning, "--allow-exec-plugins"))
	for start := time.Now(); time.Since(start) < 2*grace; time.Sleep(time.Second) {
		harness.Must(t, replicaOf(one, "web", "from2", "cluster-2", false, ips2)())
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the refused kubeconfig's command ran")
	}
	out, _ := statusOf(t, w, "table")
	if !strings.Contains(out, "peer unreachable: cluster-2") {
		t.Errorf("status does not name the refused peer:\n%s", out)
	}
	// One that does not parse: the same, with its own reason.
	harness.Must(t, os.WriteFile(peerFile, []byte("apiVersion: v1\nclusters: [\n"), 0o600))
	harness.Eventually(t, 30*time.Second, "PeerKubeconfigInvalid Event", wantEvent(one, kube.DefaultStatusNamespace, statuslease.LeaseName,
		replication.ReasonPeerKubeconfigInvalid, corev1.EventTypeWarning, "cluster-2.yaml"))
	harness.Must(t, replicaOf(one, "web", "from2", "cluster-2", false, ips2)())
	harness.Must(t, os.WriteFile(peerFile, data, 0o600))
	harness.Scale(t, two, "web", "from2", 1)
	harness.Eventually(t, 60*time.Second, "synced again once the file is fixed", replicaOf(one, "web", "from2", "cluster-2", false, waitPods(t, two, "web", "from2", 1)))
}

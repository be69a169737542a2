//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/controller"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/test/harness"
)

// A leader killed and restarted in place (same pod, so same identity)
// finds its own name on the lease and renews it at once, rather than
// waiting it out as a stranger must: here the lease is valid for an hour,
// so a replica under any other name would not lead within the test.
func TestRestartedLeaderTakesItsLeaseBack(t *testing.T) {
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 1}})
	ctx := context.Background()
	cl := w.clients[0]
	namespace(t, cl, kube.DefaultStatusNamespace)
	// The lease as a leader killed a moment ago left it.
	renewed := metav1.NewMicroTime(time.Now().Add(-time.Second))
	harness.Must(t, cl.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: controller.LeaderElectionID, Namespace: kube.DefaultStatusNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("replica-a"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &renewed, RenewTime: &renewed, LeaseTransitions: ptr.To[int32](3)},
	}))

	stop := w.startControllers(t, func(o *controller.Options) {
		o.LeaderElect, o.LeaderElectionNamespace, o.LeaderElectionIdentity = true, kube.DefaultStatusNamespace, "replica-a"
	})
	defer stop()
	harness.Eventually(t, 30*time.Second, "the restarted leader renews its own lease", func() error {
		l := &coordinationv1.Lease{}
		if err := cl.Get(ctx, client.ObjectKey{Namespace: kube.DefaultStatusNamespace, Name: controller.LeaderElectionID}, l); err != nil {
			return err
		}
		s := l.Spec
		if ptr.Deref(s.HolderIdentity, "") != "replica-a" || s.RenewTime == nil || !s.RenewTime.After(renewed.Time) {
			return fmt.Errorf("held by %q, renewed %v: not renewed by replica-a since %v", ptr.Deref(s.HolderIdentity, ""), s.RenewTime, renewed)
		}
		// A renewal, not a new leader.
		if ptr.Deref(s.LeaseTransitions, 0) != 3 {
			return fmt.Errorf("%d leader transitions, want 3", ptr.Deref(s.LeaseTransitions, 0))
		}
		return nil
	})
}

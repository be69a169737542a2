// Package workqueue holds the loop the lab's components (the IPAM, the
// data plane's node agent) run over client-go's rate-limited workqueue.
package workqueue

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Drain syncs each key the queue hands out, one at a time, until the queue
// shuts down (at the latest when ctx ends). A key whose sync fails comes
// back after the queue's backoff; failing is logged as what failed.
func Drain(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], failed string, sync func(context.Context, string) error) {
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	for {
		k, quit := q.Get()
		if quit {
			return
		}
		if err := sync(ctx, k); err != nil {
			klog.ErrorS(err, failed+"; retrying", "pod", k)
			q.AddRateLimited(k)
		} else {
			q.Forget(k)
		}
		q.Done(k)
	}
}

// Package withdraw is how `clustermap uninstall` asks the running
// controller to take back everything it published without deleting what
// users own: a Lease named LeaseName in the controller's namespace. While
// it exists the controller withdraws every export's Cloud Map records and
// every Cloud Map DNS registration, removes its finalizers, and publishes
// nothing; ServiceExports and annotated Services stay as their owners
// made them. A controller that withdrew stays withdrawn until it restarts:
// uninstall deletes the Lease last, while controllers it could not stop
// (one run outside the cluster) may still be running, and they must not
// publish again then. A new controller with no Lease publishes.
package withdraw

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// LeaseName is the request, in the controller's namespace.
const LeaseName = "clustermap-withdraw"

// Period is how often the controller looks for the request: one GET of
// one object, uncached (no informer on the namespace's Leases).
const Period = 5 * time.Second

// Signal is the request as the controller last read it.
type Signal struct {
	on   atomic.Bool
	mu   sync.Mutex
	subs []chan event.GenericEvent
}

// Requested reports whether the controller must withdraw. A nil Signal
// never does.
func (s *Signal) Requested() bool { return s != nil && s.on.Load() }

// Started is a channel that hears when the request starts (an event with
// no object: the subscriber maps it to what it must look at again).
// Subscribe before Watch starts.
func (s *Signal) Started() <-chan event.GenericEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := make(chan event.GenericEvent, 1)
	s.subs = append(s.subs, c)
	return c
}

// start records the request and tells the subscribers, the first time.
func (s *Signal) start() bool {
	if s.on.Swap(true) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.subs {
		select {
		case c <- event.GenericEvent{}:
		default: // one pending change already makes the subscriber look
		}
	}
	return true
}

// Watch reads the request every Period until ctx ends. A read that fails
// changes nothing: neither a withdrawal nor a resumption is started on
// an error.
func (s *Signal) Watch(ctx context.Context, r client.Reader, namespace string, log logr.Logger) error {
	t := time.NewTicker(Period)
	defer t.Stop()
	for {
		s.read(ctx, r, namespace, log)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// read looks for the request once.
func (s *Signal) read(ctx context.Context, r client.Reader, namespace string, log logr.Logger) {
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: LeaseName}, &coordinationv1.Lease{})
	switch {
	case err == nil:
		if s.start() {
			log.Info("withdrawing every export and Cloud Map DNS registration: clustermap uninstall asked for it; to publish again, delete the Lease and restart the controller",
				"lease", namespace+"/"+LeaseName)
		}
	case apierrors.IsNotFound(err):
		// Withdrawn for good once asked: see the package comment.
	default:
		log.Error(err, "reading the withdrawal request; retrying", "lease", namespace+"/"+LeaseName)
	}
}

// The reconciler's side of the claim protocol (lock.go): taking, keeping
// and giving up a name, with the Cloud Map calls and the memory it needs.

package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ktypes "k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// claim makes sure the Service holds its target's claim, re-reading it
// on drift checks; a nil entry means it does not (yet), with the result
// to return. A Service that lost its claim takes its instances out.
func (r *Reconciler) claim(ctx context.Context, svc *corev1.Service, target Target, owners []string) (*entry, reconcile.Result, error) {
	key := client.ObjectKeyFromObject(svc)
	r.mu.Lock()
	e := r.entries[key]
	held := e != nil && e.target == target
	fresh := held && !e.stale
	r.mu.Unlock()
	if fresh {
		return e, reconcile.Result{}, nil
	}
	cm := CloudMap{r.CloudMap}
	var ns Namespace
	var err error
	if held {
		ns = e.ns
	} else if ns, err = r.namespace(ctx, target.Namespace); errors.Is(err, ErrNamespaceNotFound) {
		r.report(ctx, svc, metav1.ConditionFalse, ReasonNamespaceNotFound, fmt.Sprintf(
			"Cloud Map namespace %q does not exist: create it (private DNS, public DNS or HTTP) or fix annotation %s; nothing is registered", target.Namespace, AnnotationNamespace))
		return nil, reconcile.Result{RequeueAfter: 30 * time.Second}, nil
	}
	if err != nil {
		r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, err.Error())
		return nil, reconcile.Result{}, err
	}
	var c Claim
	if held {
		c, err = Verify(ctx, cm, ns.ID, target.Hostname, owners[0], e.claim)
	} else {
		c, err = Acquire(ctx, cm, ns.ID, target.Hostname, owners[0], r.lastSeen(target))
	}
	if err != nil {
		if held {
			r.markStale(e)
		}
		r.claimFailed(ctx, svc, target, err)
		return nil, reconcile.Result{}, err
	}
	step := NextStep(c, owners, held, svc.Annotations[AnnotationRegistered] == target.String(), func() bool { return r.abandoned(ctx, c, target) })
	if step == TakeOverAbandoned {
		log.FromContext(ctx).Info("deleting an abandoned claim", "target", target.String(), "holder", c.Holder)
		if err = Release(ctx, cm, c, []string{c.Holder}); err == nil {
			c, err = Acquire(ctx, cm, ns.ID, target.Hostname, owners[0], Claim{})
		}
		if err != nil {
			r.claimFailed(ctx, svc, target, err)
			return nil, reconcile.Result{}, err
		}
		step = NextStep(c, owners, false, false, func() bool { return false })
	}
	switch step {
	case WithdrawAndWait, Wait:
		if step == WithdrawAndWait {
			if err := r.withdraw(ctx, svc, target, owners); err != nil {
				if res, err := settled(err); err == nil {
					return nil, res, nil
				}
				r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("deregistering from %s: %v", target, err))
				return nil, reconcile.Result{}, err
			}
			// Registered there no more; the finalizer stays, as on every
			// Service that asks for a name.
			if err := r.unmark(ctx, svc, target); err != nil {
				return nil, reconcile.Result{}, err
			}
		}
		r.mu.Lock()
		delete(r.entries, key)
		if r.waiting[target] == nil {
			r.waiting[target] = map[ktypes.NamespacedName]*Claim{}
		}
		r.waiting[target][key] = &c
		r.mu.Unlock()
		r.report(ctx, svc, metav1.ConditionFalse, ReasonDomainConflict, fmt.Sprintf(
			"%s already claimed by %s; this Service is not registered and takes over when that one lets go", target, c.Holder))
		// Waiters in this cluster are woken on release; others poll.
		return nil, reconcile.Result{RequeueAfter: 15 * time.Second}, nil
	case KeepRegistering:
		r.mu.Lock()
		defer r.mu.Unlock()
		e.claim = c
		return e, reconcile.Result{}, nil
	}
	// StartRegistering: the Cloud Map service to register in.
	family := "A"
	if Family(svc) == corev1.IPv6Protocol {
		family = "AAAA"
	}
	id, err := cm.EnsureService(ctx, ns, target.Hostname, owners[0], DNSSettings{TTL: r.TTL, Family: family, SRV: len(svc.Spec.Ports) > 0})
	if err != nil {
		r.claimFailed(ctx, svc, target, err)
		return nil, reconcile.Result{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting[target], key)
	e = &entry{target: target, ns: ns, claim: c, service: id, stale: true}
	r.entries[key] = e
	return e, reconcile.Result{}, nil
}

// abandoned reports whether the claim on target is held by a Service of
// this cluster that is gone, or neither registered there nor asking to be.
func (r *Reconciler) abandoned(ctx context.Context, c Claim, target Target) bool {
	cluster, rest, _ := strings.Cut(c.Holder, "/")
	ns, name, ok := strings.Cut(rest, "/")
	if cluster != r.Cluster || !ok {
		return false
	}
	key := ktypes.NamespacedName{Namespace: ns, Name: name}
	holder := &corev1.Service{}
	switch err := r.Client.Get(ctx, key, holder); {
	case apierrors.IsNotFound(err):
		return r.remembered(key) == nil
	case err != nil:
		return false
	}
	in := Intend(holder, r.Namespaces(ns), r.CloudMapNamespaces, r.remembered(key))
	return in.Target != target && !slices.Contains(in.Withdraw, target)
}

// claimFailed reports a failed claim; the namespace is looked up afresh
// next time, in case it was replaced.
func (r *Reconciler) claimFailed(ctx context.Context, svc *corev1.Service, target Target, err error) {
	r.mu.Lock()
	delete(r.nsCache, target.Namespace)
	r.mu.Unlock()
	r.report(ctx, svc, metav1.ConditionFalse, ReasonCloudMapError, fmt.Sprintf("claiming %s: %v", target, err))
}

// withdraw takes the Service's instances out of the Cloud Map service at
// had and, if it holds the claim there, deletes the service (if clustermap
// created it) and then the lock, waking any Service waiting for it.
func (r *Reconciler) withdraw(ctx context.Context, svc *corev1.Service, had Target, owners []string) error {
	cm := CloudMap{r.CloudMap}
	key := client.ObjectKeyFromObject(svc)
	r.mu.Lock()
	e := r.entries[key]
	r.mu.Unlock()
	ns, err := r.namespace(ctx, had.Namespace)
	if errors.Is(err, ErrNamespaceNotFound) {
		if t, ok := ParseTarget(svc.Annotations[AnnotationRegistered]); ok && t == had {
			// Registered there, and Cloud Map keeps a namespace while it
			// has services: it is looked for in the wrong place (Region,
			// account, credentials). Letting go would leave the records
			// to be resolved for ever.
			return fmt.Errorf("%w: %s holds this Service's registration, but this controller cannot find it: Cloud Map keeps a namespace while it has services, so it is most likely looked for in the wrong Region or account; held until it can be withdrawn (if the namespace is gone for good, remove the finalizer %s)",
				ErrNamespaceNotFound, had.Namespace, Finalizer)
		}
		return nil
	}
	if err != nil {
		return err
	}
	found, err := cm.FindServices(ctx, ns, had.Hostname, LockName(had.Hostname))
	if err != nil {
		return err
	}
	if main, ok := found[had.Hostname]; ok {
		cur, err := cm.Instances(ctx, main.ID)
		if err != nil && !IsServiceGone(err) {
			return err
		}
		// What this controller registered last may still be running, and
		// the listing shows only finished operations: those go too (a
		// deregistration refused while the registration runs is retried).
		r.mu.Lock()
		if err == nil && e != nil && e.target == had {
			for id, a := range e.current {
				if _, listed := cur[id]; !listed {
					if cur == nil {
						cur = map[string]Attrs{}
					}
					cur[id] = a
				}
			}
		}
		r.mu.Unlock()
		done, err := cm.Apply(ctx, main.ID, Diff(owners, nil, cur), true)
		r.announce(svc, Changes(had, nil, cur, nil, nil, done.Deregistered))
		if err != nil {
			return err
		}
		// A registration the previous leader started, or one of ours whose
		// call failed (it may have been made), may still run, and the
		// listing shows only finished operations: the withdrawal is
		// complete only once such an operation must have ended.
		if wait := time.Until(r.unseenUntil(e)); wait > 0 {
			return settling{wait}
		}
		log.FromContext(ctx).Info("withdrawn from Cloud Map", "service", key.String(), "target", had.String(), "instances", len(cur), "deregistered", len(done.Deregistered))
	}
	var c Claim
	if lock, ok := found[LockName(had.Hostname)]; ok {
		if e != nil && e.target == had && e.claim.LockID == lock.ID {
			c = e.claim
		} else if c.Holder, err = cm.LockHolder(ctx, lock.ID); err == nil {
			c.LockID = lock.ID
		} else if !errors.Is(err, ErrLockGone) {
			return err
		}
	}
	if c.HeldBy(owners) {
		if main, ok := found[had.Hostname]; ok {
			if err := cm.DeleteIfCreated(ctx, main); err != nil {
				return err
			}
		}
		if err := Release(ctx, cm, c, owners); err != nil {
			return err
		}
	}
	r.mu.Lock()
	if e != nil && e.target == had {
		delete(r.entries, key)
	}
	var wake []ktypes.NamespacedName
	for k := range r.waiting[had] {
		wake = append(wake, k)
	}
	r.mu.Unlock()
	for _, k := range wake {
		r.enqueue(ctx, k)
	}
	return nil
}

// settling says a withdrawal is done as far as can be seen, and is looked
// at again after a while, when nothing unseen may still run.
type settling struct{ after time.Duration }

func (s settling) Error() string {
	return fmt.Sprintf("withdrawal looked at again in %v, when registrations started before this controller led have ended", s.after.Round(time.Millisecond))
}

// settled turns a settling withdrawal into a requeue, and returns any
// other error as it is.
func settled(err error) (reconcile.Result, error) {
	var s settling
	if errors.As(err, &s) {
		return reconcile.Result{RequeueAfter: s.after}, nil
	}
	return reconcile.Result{}, err
}

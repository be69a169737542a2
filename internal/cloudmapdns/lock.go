package cloudmapdns

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The claim protocol: one Kubernetes Service, in any cluster, registers
// under a Cloud Map name. The claim is a lock: an API-only Cloud Map
// service named LockName(hostname) beside the name, created with its
// holder in a tag. CreateService is atomic per name, so of any number of
// claimants exactly one creates it; tags set at creation are never
// rewritten. The holder lets go by deleting the lock by the id it read, so
// it can never remove a lock another claimant created since.

// LockName is the name of the lock on hostname: a second DNS label under
// the name, which no annotation can ask for (hostnames have no dots).
func LockName(hostname string) string { return "_clustermap-claim." + hostname }

// Claim is what one claimant knows of a name's lock.
type Claim struct {
	LockID string
	Holder string // the owner recorded in the lock
}

// HeldBy reports whether one of owners holds the claim.
func (c Claim) HeldBy(owners []string) bool {
	return c.LockID != "" && slices.Contains(owners, c.Holder)
}

// LockStore is what the protocol needs of Cloud Map.
type LockStore interface {
	// CreateLock creates the lock; when it exists, a *LockTaken error
	// carries its id.
	CreateLock(ctx context.Context, namespaceID, name, holder string) (id string, err error)
	// LockHolder reads who holds a lock; ErrLockGone when it was deleted.
	LockHolder(ctx context.Context, id string) (string, error)
	// DeleteLock deletes a lock by id; a lock already gone is no error.
	DeleteLock(ctx context.Context, id string) error
}

// LockTaken says the lock exists.
type LockTaken struct{ ID string }

func (e *LockTaken) Error() string { return "lock " + e.ID + " exists" }

// ErrLockGone says a lock was deleted.
var ErrLockGone = errors.New("claim lock deleted")

// Acquire takes the name for owner, or finds who holds it. known is what
// the caller last read, which saves a read when the lock is the same one.
func Acquire(ctx context.Context, s LockStore, namespaceID, hostname, owner string, known Claim) (Claim, error) {
	for range 3 {
		id, err := s.CreateLock(ctx, namespaceID, LockName(hostname), owner)
		if err == nil {
			return Claim{LockID: id, Holder: owner}, nil
		}
		var taken *LockTaken
		if !errors.As(err, &taken) {
			return Claim{}, err
		}
		if taken.ID == known.LockID && known.Holder != "" {
			return known, nil
		}
		holder, err := s.LockHolder(ctx, taken.ID)
		if errors.Is(err, ErrLockGone) {
			continue // released between our create and our read: try again
		}
		if err != nil {
			return Claim{}, err
		}
		return Claim{LockID: taken.ID, Holder: holder}, nil
	}
	return Claim{}, fmt.Errorf("the claim on %s changed hands three times in a row; trying again later", hostname)
}

// Verify re-reads a held claim: the lock may have been deleted out of
// band (then it is taken again, by us or by whoever is faster).
func Verify(ctx context.Context, s LockStore, namespaceID, hostname, owner string, held Claim) (Claim, error) {
	holder, err := s.LockHolder(ctx, held.LockID)
	if errors.Is(err, ErrLockGone) {
		return Acquire(ctx, s, namespaceID, hostname, owner, Claim{})
	}
	if err != nil {
		return held, err
	}
	return Claim{LockID: held.LockID, Holder: holder}, nil
}

// Release gives the claim up if one of owners holds it, deleting only the
// lock it read.
func Release(ctx context.Context, s LockStore, c Claim, owners []string) error {
	if !c.HeldBy(owners) {
		return nil
	}
	return s.DeleteLock(ctx, c.LockID)
}

// ClaimStep is what a Service does once it has read its name's claim.
type ClaimStep int

const (
	// KeepRegistering: it held the claim and still does.
	KeepRegistering ClaimStep = iota
	// StartRegistering: it holds the claim now (new, or since a restart).
	StartRegistering
	// TakeOverAbandoned: a Service of this cluster that no longer wants
	// the name holds it (deleted between its claim and its finalizer):
	// that lock, and only that one, goes, and the claim is tried again.
	TakeOverAbandoned
	// Wait: another holds the name; report the conflict and try later.
	Wait
	// WithdrawAndWait: it held the name and lost it (its lock was deleted
	// out of band and someone else took the name): its instances go
	// first.
	WithdrawAndWait
)

// NextStep decides from the claim read; held says memory had it as ours,
// registeredThere that the Service's annotation says it registered at
// this name; abandoned is asked only when another holds the claim.
func NextStep(c Claim, owners []string, held, registeredThere bool, abandoned func() bool) ClaimStep {
	switch {
	case c.HeldBy(owners) && held:
		return KeepRegistering
	case c.HeldBy(owners):
		return StartRegistering
	case held || registeredThere:
		return WithdrawAndWait
	case abandoned():
		return TakeOverAbandoned
	}
	return Wait
}

// Owners are the owner values that are this Service's: its own, and those
// recorded in its AnnotationOwners when it last registered, if they name
// the same namespace and Service, which lets a cluster change its name
// (a ClusterProperty removed, say) without orphaning what it registered.
func Owners(cluster string, svc *corev1.Service) []string {
	out := []string{Owner(cluster, svc)}
	for _, o := range strings.Fields(svc.Annotations[AnnotationOwners]) {
		cl, rest, ok := strings.Cut(o, "/")
		if ok && cl != "" && rest == svc.Namespace+"/"+svc.Name && !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}

// RecordOwners is the AnnotationOwners value of a Service whose claim is
// held by holder and whose instances carry owners: each once, the holder
// first.
func RecordOwners(holder string, owners ...string) string {
	var out []string
	for _, o := range append([]string{holder}, owners...) {
		if o != "" && !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return strings.Join(out, " ")
}

package registry

import "time"

// Observer hears what a registry sees as it reads and writes, for the
// status Lease, metrics and Events: one per registry read (a Cloud Map
// Region, or the hub). Calls come from the registry's goroutines and
// return at once.
type Observer interface {
	// Read: a read of the registry ended, as err says.
	Read(err error)
	// Proofs: every cluster's last proof of life, after a read of them,
	// and which are drained.
	Proofs(proofs map[string]time.Time, drained map[string]bool)
	// Silent: a cluster is drained (silent past the TTL while others
	// proved alive), or proved alive again.
	Silent(cluster string, lastProof time.Time, silent bool)
	// Propagated: a change another cluster wrote reached this one, took
	// after it was written.
	Propagated(took time.Duration)
	// PollPages: a poll of the change feed read this many pages.
	PollPages(pages int)
	// Duplicate: another installation writes this cluster's records of
	// key.
	Duplicate(key Key, otherWriter string)
	// Foreign: records of a cluster bound to another account were refused.
	Foreign(f ForeignRecord)
	// KeptPacked: an export stays in packed records though some clusters
	// read only per-endpoint ones (it would not fit those).
	KeptPacked(key Key, msg string)
	// WriteFailed: a write of key the registry accepted failed after: the
	// export is published again.
	WriteFailed(key Key)
}

// ForeignRecord is a record refused for its creator: its cluster is bound
// to account Bound, and account CreatedBy wrote it.
type ForeignRecord struct {
	Key                       Key
	Cluster, CreatedBy, Bound string
}

// ObserverFuncs observes with the funcs that are set, and ignores the
// rest: for one-off listeners (tests, benchmarks).
type ObserverFuncs struct {
	OnRead        func(error)
	OnProofs      func(map[string]time.Time, map[string]bool)
	OnSilent      func(cluster string, lastProof time.Time, silent bool)
	OnPropagated  func(time.Duration)
	OnPollPages   func(int)
	OnDuplicate   func(Key, string)
	OnForeign     func(ForeignRecord)
	OnKeptPacked  func(Key, string)
	OnWriteFailed func(Key)
}

var _ Observer = ObserverFuncs{}

func (f ObserverFuncs) Read(err error) {
	if f.OnRead != nil {
		f.OnRead(err)
	}
}

func (f ObserverFuncs) Proofs(p map[string]time.Time, d map[string]bool) {
	if f.OnProofs != nil {
		f.OnProofs(p, d)
	}
}

func (f ObserverFuncs) Silent(cluster string, lastProof time.Time, silent bool) {
	if f.OnSilent != nil {
		f.OnSilent(cluster, lastProof, silent)
	}
}

func (f ObserverFuncs) Propagated(took time.Duration) {
	if f.OnPropagated != nil {
		f.OnPropagated(took)
	}
}

func (f ObserverFuncs) PollPages(n int) {
	if f.OnPollPages != nil {
		f.OnPollPages(n)
	}
}

func (f ObserverFuncs) Duplicate(key Key, other string) {
	if f.OnDuplicate != nil {
		f.OnDuplicate(key, other)
	}
}

func (f ObserverFuncs) Foreign(r ForeignRecord) {
	if f.OnForeign != nil {
		f.OnForeign(r)
	}
}

func (f ObserverFuncs) KeptPacked(key Key, msg string) {
	if f.OnKeptPacked != nil {
		f.OnKeptPacked(key, msg)
	}
}

func (f ObserverFuncs) WriteFailed(key Key) {
	if f.OnWriteFailed != nil {
		f.OnWriteFailed(key)
	}
}

package cloudmap

import "time"

// step is what the watcher does next.
type step int

const (
	// stepPoll reads the instance operations since the last poll.
	stepPoll step = iota
	// stepList lists namespaces and services: to sync, and now and then to
	// notice services deleted without an operation.
	stepList
	// stepCatchUp lists, then compares every known service's revision: the
	// bounded answer to more changes than are worth attributing one
	// GetOperation at a time, and to a gap the operations window cannot
	// cover.
	stepCatchUp
	// stepSweep compares every known service's revision, as a safety net.
	stepSweep
)

func (s step) String() string {
	return [...]string{"poll", "list", "catch-up", "sweep"}[s]
}

// clock is what the watcher's schedule depends on.
type clock struct {
	Now    time.Time
	Synced bool
	// Times of the last successful list, sweep (or catch-up) and poll.
	LastList, LastSweep, LastPoll time.Time
	// LastChange is the last poll that found a change.
	LastChange time.Time
	// CatchUpWanted: a poll saw more foreign operations than it attributes
	// one by one; LastCatchUp is when the last catch-up ran.
	CatchUpWanted bool
	LastCatchUp   time.Time
	// ListFailures counts listings (periodic, or a catch-up's) that failed
	// in a row; none is tried again before ListRetryAt, and polls go on
	// meanwhile. Without it every importer of a large clusterset retried
	// its listing at once, each step, past the account's ListServices
	// quota, and none polled: a whole fleet deaf (BenchmarkFleet, 50 x
	// 1,000, after its bulk export).
	ListFailures int
	ListRetryAt  time.Time
	// Pollers is how many clusters poll ListOperations in this account
	// (none across accounts): their polls share its quota.
	Pollers int
	// ResweepAt is when to compare the revisions again after a catch-up:
	// its reads may not show what changed just before it (ReadLag).
	// ResweepAgainAt is the sweep after that one, for an operation still
	// running at a catch-up after a gap in polling and created before one
	// it took as read: the polls after it stop at its marks and never list
	// it (after a catch-up right after polls they page past them and do),
	// so it shows only once it ended (OperationWait) and the read lag
	// passed.
	ResweepAt, ResweepAgainAt time.Time
}

// nextStep decides the watcher's next step. Its cost is bounded whatever
// happened before: a gap in polling is read back from the operations since
// the last successful poll (at most MaxPollPages of them), never by
// re-reading every service, so a slow step cannot make the next one slower.
func nextStep(c clock, o WatchOptions) step {
	retry := !c.Now.Before(c.ListRetryAt)
	switch {
	case !c.Synced, retry && c.Now.Sub(c.LastList) >= o.ListInterval:
		return stepList
	case retry && !c.LastPoll.IsZero() && c.Now.Sub(c.LastPoll) > o.MaxLookback:
		return stepCatchUp
	case retry && c.CatchUpWanted && c.Now.Sub(c.LastCatchUp) >= o.CatchUpInterval:
		return stepCatchUp
	case !c.ResweepAt.IsZero() && !c.Now.Before(c.ResweepAt), c.Now.Sub(c.LastSweep) >= o.SweepInterval:
		return stepSweep
	default:
		return stepPoll
	}
}

// nextWait is how long to wait before the next step: fast while changes
// come in bursts, or until a wanted catch-up may run; never so fast that
// the clusters polling in the account together pass pollCalls.
func nextWait(c clock, o WatchOptions) time.Duration {
	fast := max(o.FastInterval, time.Duration(min(c.Pollers, maxPollers))*time.Second/pollCalls)
	wait := max(o.PollInterval, fast)
	if c.Now.Sub(c.LastChange) < o.ActiveWindow {
		wait = fast
	}
	if !c.Synced && c.ListRetryAt.After(c.Now) {
		return c.ListRetryAt.Sub(c.Now) // nothing to poll before the first listing
	}
	if c.CatchUpWanted {
		at := c.LastCatchUp.Add(o.CatchUpInterval)
		if at.Before(c.ListRetryAt) {
			at = c.ListRetryAt
		}
		wait = min(wait, max(at.Sub(c.Now), fast))
	}
	if !c.ResweepAt.IsZero() {
		wait = min(wait, max(c.ResweepAt.Sub(c.Now), 0))
	}
	return wait
}

// listBackoff is how long after the failures-th failed listing in a row
// the next may start, before jitter: CatchUpInterval doubled each time, at
// most a minute. At 50 importers with 10 pages of services each, a minute
// apart they need 9 ListServices calls a second together.
func listBackoff(failures int, o WatchOptions) time.Duration {
	return min(o.CatchUpInterval<<min(max(failures-1, 0), 5), time.Minute)
}

// pollCalls is the ListOperations calls a second that the clusters of a
// one-account clusterset may make together: four fifths of the profile's
// assumed 50/s per operation and account (AWS publishes none), the rest
// left to catch-ups and other tools. A change makes every importer poll
// fast at once: 49 importers every 300 ms would make 163 calls a second.
// Polls slow down past 12 clusters in a burst (1.25 s at 50), past 60
// when idle.
const pollCalls = 40

// maxPollers bounds the clusters counted: forged records slow polls to 5 s
// at worst.
const maxPollers = 200

// readResult is what the watcher does after reading one service.
type readResult int

const (
	// readReport: tell the sink what the read found.
	readReport readResult = iota
	// readRetry: the read failed; the service is unreadable (its imports
	// stay as they are) and is read again after its backoff.
	readRetry
	// readConfirm: an exported service was found exported nowhere; only a
	// second read ConfirmAbsence after the first may remove its imports
	// (Cloud Map's reads are eventually consistent).
	readConfirm
)

// afterRead decides what a read of a service leads to: failed tells the
// read failed, empty that it found no export. exported says the sink last
// heard exports of the service, absentSince when a read first found it
// gone (zero: never). It returns when to read again for readRetry and
// readConfirm.
func afterRead(now time.Time, failed, empty, exported bool, absentSince time.Time, backoff time.Duration, o WatchOptions) (readResult, time.Time) {
	switch {
	case failed:
		return readRetry, now.Add(backoff)
	case empty && exported:
		first := absentSince
		if first.IsZero() {
			first = now
		}
		if now.Sub(first) < o.ConfirmAbsence {
			return readConfirm, first.Add(o.ConfirmAbsence)
		}
	}
	return readReport, time.Time{}
}

package cloudmap

import (
	"testing"
	"time"
)

func TestNextStep(t *testing.T) {
	o := WatchOptions{}
	o.defaults()
	t0 := time.Unix(1700000000, 0)
	base := clock{Now: t0, Synced: true, LastList: t0.Add(-time.Minute), LastSweep: t0.Add(-time.Minute), LastPoll: t0.Add(-time.Second),
		LastCatchUp: t0.Add(-time.Minute)}
	for _, tc := range []struct {
		name string
		mod  func(*clock)
		want step
	}{
		{"idle: poll", nil, stepPoll},
		{"not synced: list", func(c *clock) { c.Synced = false }, stepList},
		{"list due", func(c *clock) { c.LastList = t0.Add(-o.ListInterval) }, stepList},
		{"sweep due", func(c *clock) { c.LastSweep = t0.Add(-o.SweepInterval) }, stepSweep},
		{"many foreign operations: catch up", func(c *clock) { c.CatchUpWanted = true }, stepCatchUp},
		{"catch-ups at most every CatchUpInterval", func(c *clock) { c.CatchUpWanted, c.LastCatchUp = true, t0.Add(-o.CatchUpInterval/2) }, stepPoll},
		// A 60 s outage is read back by the next poll, not by re-reading
		// every service: only a gap past MaxLookback catches up.
		{"a minute without polls: poll", func(c *clock) { c.LastPoll = t0.Add(-time.Minute) }, stepPoll},
		{"a gap past MaxLookback: catch up", func(c *clock) { c.LastPoll = t0.Add(-o.MaxLookback - time.Second) }, stepCatchUp},
		{"a list wins over a catch-up", func(c *clock) { c.CatchUpWanted, c.Synced = true, false }, stepList},
		// A failed listing is tried again after its backoff; polls go on
		// meanwhile (the first listing aside: nothing is known before it).
		{"a failed catch-up: poll until its retry", func(c *clock) { c.CatchUpWanted, c.ListRetryAt = true, t0.Add(time.Second) }, stepPoll},
		{"a failed catch-up: retried once due", func(c *clock) { c.CatchUpWanted, c.ListRetryAt = true, t0 }, stepCatchUp},
		{"a failed list: poll until its retry", func(c *clock) { c.LastList, c.ListRetryAt = t0.Add(-o.ListInterval), t0.Add(time.Second) }, stepPoll},
		{"a gap past MaxLookback after a failed catch-up: poll until its retry", func(c *clock) {
			c.LastPoll, c.ListRetryAt = t0.Add(-o.MaxLookback-time.Second), t0.Add(time.Second)
		}, stepPoll},
		{"not synced: list, whatever failed", func(c *clock) { c.Synced, c.ListRetryAt = false, t0.Add(time.Minute) }, stepList},
	} {
		c := base
		if tc.mod != nil {
			tc.mod(&c)
		}
		if got := nextStep(c, o); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestNextWait(t *testing.T) {
	o := WatchOptions{}
	o.defaults()
	t0 := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		name string
		c    clock
		want time.Duration
	}{
		{"idle", clock{Now: t0, LastChange: t0.Add(-time.Minute), LastCatchUp: t0.Add(-time.Minute)}, o.PollInterval},
		{"in a burst", clock{Now: t0, LastChange: t0.Add(-time.Second)}, o.FastInterval},
		{"until a wanted catch-up may run", clock{Now: t0, LastChange: t0.Add(-time.Minute), CatchUpWanted: true, LastCatchUp: t0.Add(-o.CatchUpInterval + time.Second)}, time.Second},
		{"until a failed catch-up's retry", clock{Now: t0, Synced: true, LastChange: t0.Add(-time.Minute), CatchUpWanted: true, LastCatchUp: t0.Add(-time.Hour), ListRetryAt: t0.Add(time.Second)}, time.Second},
		{"a failed first listing: until its retry", clock{Now: t0, ListRetryAt: t0.Add(20 * time.Second)}, 20 * time.Second},
		{"a failed catch-up's retry past the next poll", clock{Now: t0, Synced: true, LastChange: t0.Add(-time.Minute), CatchUpWanted: true, LastCatchUp: t0.Add(-time.Hour), ListRetryAt: t0.Add(time.Minute)}, o.PollInterval},
		{"a wanted catch-up that may run now", clock{Now: t0, LastChange: t0.Add(-time.Minute), CatchUpWanted: true, LastCatchUp: t0.Add(-time.Hour)}, o.FastInterval},
		// The account's ListOperations calls: 12 clusters poll at the
		// shipped rhythm, 50 slower in a burst, 100 slower always.
		{"in a burst, 12 clusters in one account", clock{Now: t0, LastChange: t0.Add(-time.Second), Pollers: 12}, o.FastInterval},
		{"in a burst, 50 clusters in one account", clock{Now: t0, LastChange: t0.Add(-time.Second), Pollers: 50}, 1250 * time.Millisecond},
		{"idle, 50 clusters in one account", clock{Now: t0, LastChange: t0.Add(-time.Minute), Pollers: 50}, o.PollInterval},
		{"idle, 100 clusters in one account", clock{Now: t0, LastChange: t0.Add(-time.Minute), Pollers: 100}, 2500 * time.Millisecond},
		{"idle, 1,000 records in one account", clock{Now: t0, LastChange: t0.Add(-time.Minute), Pollers: 1000}, 5 * time.Second},
		{"a wanted catch-up, 50 clusters in one account", clock{Now: t0, LastChange: t0.Add(-time.Minute), CatchUpWanted: true, LastCatchUp: t0.Add(-time.Hour), Pollers: 50}, 1250 * time.Millisecond},
	} {
		if got := nextWait(tc.c, o); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestListBackoff(t *testing.T) {
	o := WatchOptions{}
	o.defaults()
	for failures, want := range map[int]time.Duration{1: 3 * time.Second, 2: 6 * time.Second, 4: 24 * time.Second, 5: 48 * time.Second, 6: time.Minute, 100: time.Minute} {
		if got := listBackoff(failures, o); got != want {
			t.Errorf("after %d failures: %v, want %v", failures, got, want)
		}
	}
}

func TestAfterRead(t *testing.T) {
	o := WatchOptions{}
	o.defaults()
	now := time.Unix(1000, 0)
	for _, c := range []struct {
		name                    string
		failed, empty, exported bool
		absentSince             time.Time
		want                    readResult
		at                      time.Time
	}{
		{name: "found exports", want: readReport},
		{name: "a failure backs off, never reports", failed: true, exported: true, want: readRetry, at: now.Add(4 * time.Second)},
		{name: "a failure of a service found gone before backs off", failed: true, empty: true, exported: true, absentSince: now.Add(-time.Minute), want: readRetry, at: now.Add(4 * time.Second)},
		{name: "never exported and empty: reported (nothing to remove)", empty: true, want: readReport},
		{name: "exported, found gone first: confirm later", empty: true, exported: true, want: readConfirm, at: now.Add(o.ConfirmAbsence)},
		{name: "gone, confirmation too early", empty: true, exported: true, absentSince: now.Add(-time.Second), want: readConfirm, at: now.Add(o.ConfirmAbsence - time.Second)},
		{name: "gone, confirmed", empty: true, exported: true, absentSince: now.Add(-o.ConfirmAbsence), want: readReport},
		{name: "back before confirmation", exported: true, absentSince: now.Add(-time.Second), want: readReport},
	} {
		got, at := afterRead(now, c.failed, c.empty, c.exported, c.absentSince, 4*time.Second, o)
		if got != c.want || !at.Equal(c.at) {
			t.Errorf("%s: %v at %v, want %v at %v", c.name, got, at, c.want, c.at)
		}
	}
}

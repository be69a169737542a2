//go:build e2e

package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/registry/cloudmap"
)

// model is what a benchmark's targets are computed from: the emulator's
// profile (how long operations take, how far reads trail them) and the
// shipped settings (the watcher's schedule, each cluster's call budget).
type model struct {
	profile cloudmaplocal.Profile
	watch   cloudmap.WatchOptions
}

// shipped is the model of the shipped defaults against the profile the
// benchmarks' emulator runs (the default, AWS).
func shipped() model {
	return model{profile: cloudmaplocal.AWS(), watch: cloudmap.WatchOptions{}.WithDefaults()}
}

// slack is the controllers' own share of a change's time: Kubernetes
// watches and writes, a reconcile, the decode.
const slack = time.Second

// changeBound is the longest a change may take from its write to an
// importer's read of it: the operation (its slowest), the poll that finds
// it, the re-read past the read lag, and the controllers' slack.
func (m model) changeBound() time.Duration {
	return m.profile.OperationTime.Max + m.watch.PollInterval + m.watch.Reread(m.profile.ReadLag) + slack
}

// changeWhy says what changeBound is made of.
func (m model) changeWhy() string {
	return fmt.Sprintf("operation <= %v + poll %v + re-read past the %v read lag at %v + %v",
		m.profile.OperationTime.Max, m.watch.PollInterval, m.profile.ReadLag, m.watch.Reread(m.profile.ReadLag), slack)
}

// writeFloor is the least time calls control-plane calls take at one
// cluster's budget (its burst spent first).
func writeFloor(calls float64) time.Duration {
	return time.Duration(max(0, calls-cloudmapclient.DefaultBurst) / cloudmapclient.DefaultQPS * float64(time.Second))
}

// readFloor is the least time the importers take to read a bulk export:
// each reads each changed service once at least (DiscoverInstances),
// and together they hold the account's documented 1,000 a second.
func readFloor(importers, services int) time.Duration {
	return time.Duration(float64(importers*services) / 1000 * float64(time.Second))
}

// within prints a result against its target and fails the benchmark when
// it misses.
func within(b testing.TB, what string, got, target time.Duration, why string) {
	b.Helper()
	verdict := "met"
	if got > target {
		verdict = "MISSED"
		b.Errorf("%s: %v, past its target %v (%s)", what, got.Round(time.Millisecond), target.Round(time.Millisecond), why)
	}
	fmt.Printf("  %s: %v (target <= %v: %s) %s\n", what, got.Round(time.Millisecond), target.Round(time.Millisecond), why, verdict)
}

// atMost is within for counts.
func atMost(b testing.TB, what string, got, target float64, why string) {
	b.Helper()
	verdict := "met"
	if got > target {
		verdict = "MISSED"
		b.Errorf("%s: %.1f, past its target %.1f (%s)", what, got, target, why)
	}
	fmt.Printf("  %s: %.1f (target <= %.1f: %s) %s\n", what, got, target, why, verdict)
}

// sharedChangeBound is changeBound across accounts, where importers learn
// of a change from the writer's change record (no operation of another
// account can be listed): the record's write waits up to the write
// interval, takes its own operation, and its read may trail it by the
// read lag; the change's own operation ran meanwhile.
func (m model) sharedChangeBound() time.Duration {
	return m.changeBound() + cloudmap.ChangeWriteInterval + m.profile.OperationTime.Max + m.profile.ReadLag
}

func (m model) sharedChangeWhy() string {
	return fmt.Sprintf("a change's bound %v + the change record's write interval %v, operation <= %v and read lag %v",
		m.changeBound(), cloudmap.ChangeWriteInterval, m.profile.OperationTime.Max, m.profile.ReadLag)
}

// idleControl is the most control-plane calls a minute an idle cluster
// of a two-cluster clusterset makes with namespaces of services: a poll
// each PollInterval (one page: the AWS profile's other tenants finish 1
// operation a second, a page holds 100), a list each ListInterval (the
// namespaces, then each one's services, the change records' namespace
// included), its heartbeats or its lookups of the other's (one call
// each) and one call a minute for the rest (a retry).
func (m model) idleControl(namespaces int) (float64, string) {
	polls := time.Minute.Seconds() / m.watch.PollInterval.Seconds()
	lists := time.Minute.Seconds() / m.watch.ListInterval.Seconds() * float64(2+namespaces)
	beats := time.Minute.Seconds() / cloudmap.MinHeartbeat.Seconds()
	return polls + lists + beats + 1, fmt.Sprintf("%.0f polls of one page + %.1f list calls (%d namespaces every %v) + %.0f heartbeats + 1",
		polls, lists, namespaces+1, m.watch.ListInterval, beats)
}

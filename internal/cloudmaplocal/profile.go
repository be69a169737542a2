package cloudmaplocal

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Profile is how the emulator behaves where Cloud Map's API reference
// promises nothing or AWS publishes no number: how long operations take,
// how far reads lag, how busy the account is, its request quotas and how
// often accepted operations fail. docs/emulator.md gives every default and
// where it comes from.
type Profile struct {
	// Name says what the profile models: "aws" or "instant".
	Name string
	// OperationTime is how long an asynchronous operation stays SUBMITTED
	// or PENDING: uniform between Min and Max; zero completes it at once.
	OperationTime Spread
	// ReadLag is how far the data plane (DiscoverInstances,
	// DiscoverInstancesRevision) trails completed operations: each read
	// shows the state of a moment drawn uniformly from the last ReadLag,
	// so two reads in a row may go backwards, as reads served by different
	// replicas do.
	ReadLag time.Duration
	// TenantOperations are the operations per second of other tenants of
	// the account (ECS services registering tasks): ListOperations pages
	// through them too.
	TenantOperations float64
	// LateFailureRate is the share of asynchronous operations that are
	// accepted and then end FAIL.
	LateFailureRate float64
	// ControlRate is each control-plane operation's request quota per
	// account and Region; DataRates are the data-plane ones by operation.
	ControlRate RateLimit
	DataRates   map[string]RateLimit
}

// Spread is a uniform distribution of durations.
type Spread struct{ Min, Max time.Duration }

func (s Spread) draw() time.Duration {
	if s.Max <= s.Min {
		return s.Min
	}
	return s.Min + rand.N(s.Max-s.Min)
}

func (s Spread) String() string {
	if s.Max <= s.Min {
		return s.Min.String()
	}
	return fmt.Sprintf("%v-%v", s.Min, s.Max)
}

// AWS is Cloud Map as its documentation describes it, with conservative
// assumptions where it is silent: the default of cloudmap-local and of
// every test fixture.
func AWS() Profile {
	return Profile{
		Name:             "aws",
		OperationTime:    Spread{Min: 500 * time.Millisecond, Max: 4 * time.Second},
		ReadLag:          2 * time.Second,
		TenantOperations: 1,
		LateFailureRate:  0.005,
		ControlRate:      RateLimit{Rate: 50, Burst: 100},
		DataRates:        DefaultRateLimits(),
	}
}

// Instant answers at once: operations complete before their call returns,
// reads show every write, no other tenant, no quota on calls, nothing fails
// late. Only for unit tests of logic; a test of a promise runs under AWS.
func Instant() Profile { return Profile{Name: "instant"} }

// ProfileNamed returns a profile by name.
func ProfileNamed(name string) (Profile, error) {
	switch name {
	case "aws":
		return AWS(), nil
	case "instant":
		return Instant(), nil
	}
	return Profile{}, fmt.Errorf("unknown profile %q: aws (Cloud Map as documented) or instant (unit tests of logic)", name)
}

// rateLimit is the profile's quota on op.
func (p Profile) rateLimit(op string) (RateLimit, bool) {
	if rl, ok := p.DataRates[op]; ok {
		return rl, true
	}
	if dataPlane[op] {
		return RateLimit{}, false
	}
	return p.ControlRate, p.ControlRate.Rate > 0
}

// dataPlane are the operations served by Cloud Map's data plane.
var dataPlane = map[string]bool{"DiscoverInstances": true, "DiscoverInstancesRevision": true}

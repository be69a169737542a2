// Package cloudmaplocal is a local AWS Cloud Map: an HTTP server speaking
// the service's AWS JSON 1.1 protocol with all operations of its model, the
// model's input validation, the service's documented behaviour and quotas,
// and injectable faults. The real aws-sdk-go-v2 client talks to it unchanged.
package cloudmaplocal

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

const targetPrefix = "Route53AutoNaming_v20170314."

// Options configure a Server.
type Options struct {
	// DataDir keeps state across restarts; empty keeps it in memory only.
	DataDir string
	// Region serves requests that carry no SigV4 credential scope; a
	// signed request is served in the Region it was signed for, each
	// Region with its own state, ARNs and operations.
	Region string
	// Account owns the calls of every access key Accounts does not name.
	Account string
	// Accounts maps access key ids to the account they belong to.
	Accounts map[string]string
	// PermissiveSharing lets any account with access to a shared namespace
	// change or remove what another account created in it (re-registering
	// an instance makes it the registrant's): the loose reading of what
	// the docs leave open, where the strict one (the default) refuses.
	PermissiveSharing bool
	// Profile is how Cloud Map behaves where its reference is silent; nil
	// is AWS(), Cloud Map as documented. Instant() is for unit tests of
	// logic only.
	Profile *Profile
	// Quotas the service lets accounts raise.
	MaxNamespaces            int
	MaxInstancesPerNamespace int
	// MaxOperations bounds the finished operations kept (oldest go first),
	// so that memory, ListOperations and the snapshot stay flat; default
	// 10,000, enough for any UPDATE_DATE window a poller reads.
	MaxOperations int
	// Credentials, when set, turn on SigV4 checking: access key -> secret.
	Credentials map[string]string
	Faults      Faults
	Logger      *slog.Logger
}

// Fixed quotas of the service.
const (
	maxInstancesPerService = 1000
	maxCustomAttributes    = 30
	maxAttributesLength    = 5000
	maxTagsPerResource     = 50
	maxServiceAttributes   = 30
)

// Server is the emulator. Its API handler is Handler; AdminHandler serves
// faults and metrics on a separate listener.
type Server struct {
	opts Options

	mu      sync.RWMutex
	regions map[string]*region
	dirty   bool

	profile Profile
	faults  *faultState
	quotas  *quotaState
	metrics *metrics
	done    chan struct{}
	wg      sync.WaitGroup
	timers  map[string]*time.Timer
}

// region is one Region's Cloud Map: its own namespaces, services,
// operations and RAM shares. It implements the API for calls signed for it.
type region struct {
	*Server
	name string
	st   *state
	ix   *index
	// finished are the ids of finished operations, oldest first: pruned
	// past MaxOperations.
	finished []string
	// tenants are when each account's other tenants last added an
	// operation (Profile.TenantOperations).
	tenants map[string]time.Time
	// pending are the unfinished operations.
	pending map[string]*operationRec
}

// New loads any saved state and starts the server's background work.
func New(opts Options) (*Server, error) {
	opts.Region = cmp.Or(opts.Region, "us-east-1")
	opts.Account = cmp.Or(opts.Account, "123456789012")
	opts.MaxNamespaces = cmp.Or(opts.MaxNamespaces, 50)
	opts.MaxInstancesPerNamespace = cmp.Or(opts.MaxInstancesPerNamespace, 2000)
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.MaxOperations = cmp.Or(opts.MaxOperations, 10000)
	states := map[string]*state{}
	if opts.DataDir != "" {
		var err error
		if states, err = loadSnapshot(opts.DataDir, opts.Region, opts.Account); err != nil {
			return nil, err
		}
	}
	profile := AWS()
	if opts.Profile != nil {
		profile = *opts.Profile
	}
	s := &Server{
		opts:    opts,
		profile: profile,
		quotas:  &quotaState{limiters: map[limiterKey]*rate.Limiter{}},
		regions: map[string]*region{},
		faults:  newFaultState(opts.Faults),
		metrics: newMetrics(),
		done:    make(chan struct{}),
		timers:  map[string]*time.Timer{},
	}
	s.metrics.register(s)
	s.mu.Lock()
	for name, st := range states {
		r := &region{Server: s, name: name, st: st, ix: buildIndex(st), tenants: map[string]time.Time{}, pending: map[string]*operationRec{}}
		s.regions[name] = r
		// Operations a previous run left unfinished finish now or when due.
		for _, op := range st.Operations {
			if op.Pending != nil {
				r.pending[op.Id] = op
				r.schedule(op)
			} else {
				r.finished = append(r.finished, op.Id)
			}
		}
		slices.SortFunc(r.finished, func(a, b string) int {
			return st.Operations[a].UpdateDate.Compare(st.Operations[b].UpdateDate)
		})
		r.prune()
	}
	s.mu.Unlock()
	if opts.DataDir != "" {
		s.wg.Add(1)
		go s.persistLoop()
	}
	return s, nil
}

// Close stops background work and writes the final snapshot.
func (s *Server) Close() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	close(s.done)
	s.wg.Wait()
	s.mu.Lock()
	for _, t := range s.timers {
		t.Stop()
	}
	s.mu.Unlock()
	return s.flush()
}

// persistLoop writes the snapshot at most every 100 ms while state changes,
// so that bursts of registrations cost one write.
func (s *Server) persistLoop() {
	defer s.wg.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			if err := s.flush(); err != nil {
				s.opts.Logger.Error("writing the state snapshot failed", "dir", s.opts.DataDir, "err", err)
			}
		}
	}
}

func (s *Server) flush() error {
	if s.opts.DataDir == "" {
		return nil
	}
	s.mu.Lock()
	if !s.dirty {
		s.mu.Unlock()
		return nil
	}
	states := map[string]*state{}
	for name, r := range s.regions {
		states[name] = r.st
	}
	data, err := json.Marshal(snapshot{Regions: states})
	s.dirty = false
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return writeSnapshot(s.opts.DataDir, data)
}

// changed marks the state for the next snapshot; callers hold s.mu.
func (s *Server) changed() { s.dirty = true }

// Handler serves the Cloud Map API. The host is not checked, so the SDK's
// data- host prefix for DiscoverInstances reaches it too.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveAPI) }

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), targetPrefix)
	code := "OK"
	who := s.callerOf(r)
	defer func() { s.metrics.observe(op, code, who, time.Since(start)) }()

	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		code = writeError(w, errorf("SerializationException", "reading the request: %v", err))
		return
	}
	if isSTS(r, body) {
		op = "sts:GetCallerIdentity"
		if aerr := s.checkSignature(r, body); aerr != nil {
			code = writeError(w, aerr)
			return
		}
		s.serveSTS(w, r, body, who)
		return
	}
	spec, known := modelOperations[op]
	if r.Method != http.MethodPost || !known {
		op = "unknown"
		code = writeError(w, errorf("UnknownOperationException", "unknown operation %q", r.Header.Get("X-Amz-Target")))
		return
	}
	if aerr := s.checkSignature(r, body); aerr != nil {
		code = writeError(w, aerr)
		return
	}
	if aerr := s.faults.inject(r.Context(), op, who); aerr != nil {
		code = writeError(w, aerr)
		return
	}
	if aerr := s.quotas.take(s.profile, op, who); aerr != nil {
		code = writeError(w, aerr)
		return
	}
	var decoded any = map[string]any{}
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&decoded); err != nil {
			code = writeError(w, errorf("SerializationException", "the request body is not JSON: %v", err))
			return
		}
	}
	if aerr := validate(spec.input, decoded); aerr != nil {
		code = writeError(w, aerr)
		return
	}
	if aerr := s.faults.failRead(op, who, decoded); aerr != nil {
		code = writeError(w, aerr)
		return
	}
	out, err := spec.call(withCaller(r.Context(), who), s.region(who.region), body)
	if err != nil {
		aerr, ok := err.(*apiError)
		if !ok {
			aerr = errorf("InternalFailure", "%v", err)
		}
		code = writeError(w, aerr)
		return
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-Requestid", randomRequestID())
	_ = json.NewEncoder(w).Encode(out)
}

func randomRequestID() string {
	b := randomID(32)
	return b[:8] + "-" + b[8:12] + "-" + b[12:16] + "-" + b[16:20] + "-" + b[20:]
}

func writeError(w http.ResponseWriter, e *apiError) string {
	body := map[string]any{"__type": e.Code, "Message": e.Message}
	for k, v := range e.Extra {
		body[k] = v
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-Errortype", e.Code)
	w.Header().Set("X-Amzn-Requestid", randomRequestID())
	w.WriteHeader(e.Status())
	_ = json.NewEncoder(w).Encode(body)
	return e.Code
}

// Faults are injected into API calls; all can change at run time.
type Faults struct {
	// Outage answers every call with 503 ServiceUnavailable.
	Outage bool `json:"outage"`
	// ErrorRate is the share of calls answered with 500 InternalFailure.
	ErrorRate float64 `json:"errorRate"`
	// Latency is added to every call.
	Latency Duration `json:"latency"`
	// Hang never answers a call, until its caller gives up (a connection
	// that hangs); calls in flight when it is lifted still hang.
	Hang bool `json:"hang,omitempty"`
	// OperationFailureRate is the share of asynchronous operations that end FAIL.
	OperationFailureRate float64 `json:"operationFailureRate"`
	// RateLimits are token buckets per operation; "*" applies to every
	// operation without its own.
	RateLimits map[string]RateLimit `json:"rateLimits"`
	// FailReadsOf are services, as "namespace name/service name", whose
	// DiscoverInstances calls answer 500 InternalFailure.
	FailReadsOf []string `json:"failReadsOf,omitempty"`
	// StaleServiceCounts reports every namespace's ServiceCount as 0, as a
	// count that lags behind the services does.
	StaleServiceCounts bool `json:"staleServiceCounts,omitempty"`
	// Regions, when set, limits every fault above to calls signed for
	// these Regions: one Region's outage beside healthy ones.
	Regions []string `json:"regions,omitempty"`
}

// RateLimit is a token bucket: Rate calls per second, bursts up to Burst.
type RateLimit struct {
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst"`
}

// DefaultRateLimits are the data-plane limits AWS documents, each per
// account and Region; control-plane limits are unpublished and off unless set.
func DefaultRateLimits() map[string]RateLimit {
	return map[string]RateLimit{
		"DiscoverInstances":         {Rate: 1000, Burst: 2000},
		"DiscoverInstancesRevision": {Rate: 3000, Burst: 6000},
	}
}

// Duration is a time.Duration written as "1.5s" in JSON.
type Duration struct{ time.Duration }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	d.Duration = v
	return err
}

// failOperation decides whether an accepted operation ends FAIL: the
// profile's late failures, and the injected ones.
func (s *Server) failOperation() bool {
	for _, rate := range []float64{s.profile.LateFailureRate, s.faults.get().OperationFailureRate} {
		if rate > 0 && rand.Float64() < rate {
			return true
		}
	}
	return false
}

// arn names a resource of owner the way the service does.
func (s *region) arn(owner, kind, id string) string {
	return fmt.Sprintf("arn:aws:servicediscovery:%s:%s:%s/%s", s.name, owner, kind, id)
}

// region returns the Region's state, made on its first call.
func (s *Server) region(name string) *region {
	s.mu.RLock()
	r := s.regions[name]
	s.mu.RUnlock()
	if r != nil {
		return r
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r = s.regions[name]; r == nil {
		r = &region{Server: s, name: name, st: newState(), ix: buildIndex(newState()), tenants: map[string]time.Time{}, pending: map[string]*operationRec{}}
		s.regions[name] = r
	}
	return r
}

// ensure a region implements every operation of the model.
var _ api = (*region)(nil)

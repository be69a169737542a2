package cloudmaplocal

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"
)

type faultState struct {
	mu sync.RWMutex
	f  Faults
	// limiters are the token buckets by operation, account and Region,
	// made on first use: AWS applies its request quotas per account and Region.
	limiters map[limiterKey]*rate.Limiter
}

type limiterKey struct{ op, account, region string }

func newFaultState(f Faults) *faultState {
	fs := &faultState{}
	fs.set(f)
	return fs
}

func (fs *faultState) get() Faults {
	fs.mu.RLock()
	defer fs.mu.RUnlock()
	return fs.f
}

func (fs *faultState) set(f Faults) {
	fs.mu.Lock()
	fs.f, fs.limiters = f, map[limiterKey]*rate.Limiter{}
	fs.mu.Unlock()
}

// limiter is the caller's token bucket for op, or nil when op has no limit.
func (fs *faultState) limiter(f Faults, op string, who caller) *rate.Limiter {
	name := op
	rl, ok := f.RateLimits[op]
	if !ok {
		name = "*"
		if rl, ok = f.RateLimits["*"]; !ok {
			return nil
		}
	}
	key := limiterKey{name, who.account, who.region}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	lim := fs.limiters[key]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(rl.Rate), max(rl.Burst, 1))
		fs.limiters[key] = lim
	}
	return lim
}

// inject applies the faults to one call of op: added latency, the outage
// switch, the caller's token bucket for op, then the random error rate.
func (fs *faultState) inject(ctx context.Context, op string, who caller) *apiError {
	fs.mu.RLock()
	f := fs.f
	fs.mu.RUnlock()
	if len(f.Regions) > 0 && !slices.Contains(f.Regions, who.region) {
		return nil
	}
	lim := fs.limiter(f, op, who)
	if f.Latency.Duration > 0 {
		select {
		case <-time.After(f.Latency.Duration):
		case <-ctx.Done():
		}
	}
	if f.Hang {
		<-ctx.Done()
		return errorf("RequestTimeout", "The caller gave up (injected hang)")
	}
	if f.Outage {
		return errorf("ServiceUnavailable", "Service is unavailable (injected outage)")
	}
	if lim != nil && !lim.Allow() {
		return errorf("RequestLimitExceeded", "Rate exceeded for %s", op)
	}
	if f.ErrorRate > 0 && rand.Float64() < f.ErrorRate {
		return errorf("InternalFailure", "An internal error occurred (injected)")
	}
	return nil
}

// quotaState holds the profile's request quotas: token buckets per
// operation, account and Region, as AWS applies them. Faults' RateLimits
// come on top.
type quotaState struct {
	mu       sync.Mutex
	limiters map[limiterKey]*rate.Limiter
}

func (q *quotaState) take(p Profile, op string, who caller) *apiError {
	rl, ok := p.rateLimit(op)
	if !ok {
		return nil
	}
	key := limiterKey{op, who.account, who.region}
	q.mu.Lock()
	lim := q.limiters[key]
	if lim == nil {
		lim = rate.NewLimiter(rate.Limit(rl.Rate), max(rl.Burst, 1))
		q.limiters[key] = lim
	}
	q.mu.Unlock()
	if !lim.Allow() {
		return errorf("RequestLimitExceeded", "Rate exceeded for %s", op)
	}
	return nil
}

// failRead fails DiscoverInstances of the services FailReadsOf names.
func (fs *faultState) failRead(op string, who caller, decoded any) *apiError {
	f := fs.get()
	if op != "DiscoverInstances" || len(f.Regions) > 0 && !slices.Contains(f.Regions, who.region) {
		return nil
	}
	in, _ := decoded.(map[string]any)
	ns, _ := in["NamespaceName"].(string)
	name, _ := in["ServiceName"].(string)
	if slices.Contains(f.FailReadsOf, ns+"/"+name) {
		return errorf("InternalFailure", "An internal error occurred reading %s/%s (injected)", ns, name)
	}
	return nil
}

// AdminHandler serves, apart from the API: GET/PUT /faults (JSON Faults; PUT
// replaces them), GET/POST/DELETE /shares (the RAM step: ShareRequest),
// GET /metrics (Prometheus) and GET /healthz.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.faults.get())
	})
	mux.HandleFunc("PUT /faults", func(w http.ResponseWriter, r *http.Request) {
		var f Faults
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			http.Error(w, "faults: "+err.Error(), http.StatusBadRequest)
			return
		}
		s.faults.set(f)
		s.opts.Logger.Info("faults changed", "faults", f)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(f)
	})
	mux.HandleFunc("GET /shares", s.serveShares)
	mux.HandleFunc("POST /shares", s.serveShares)
	mux.HandleFunc("DELETE /shares", s.serveShares)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return mux
}

// SetFaults replaces the injected faults.
func (s *Server) SetFaults(f Faults) { s.faults.set(f) }

type metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cloudmaplocal_requests_total",
			Help: "API calls by operation, result code (OK or the error code), calling account and Region.",
		}, []string{"operation", "code", "account", "region"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cloudmaplocal_request_duration_seconds",
			Help:    "API call latency by operation, injected latency included.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1},
		}, []string{"operation"}),
	}
	m.reg.MustRegister(m.requests, m.latency)
	return m
}

func (m *metrics) observe(op, code string, who caller, d time.Duration) {
	m.requests.WithLabelValues(op, code, who.account, who.region).Inc()
	m.latency.WithLabelValues(op).Observe(d.Seconds())
}

// register adds gauges of the state's size, every Region together.
func (m *metrics) register(s *Server) {
	count := func(name, help string, f func(*region) int) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			s.mu.RLock()
			defer s.mu.RUnlock()
			n := 0
			for _, r := range s.regions {
				n += f(r)
			}
			return float64(n)
		}))
	}
	count("cloudmaplocal_namespaces", "Namespaces.", func(r *region) int { return len(r.st.Namespaces) })
	count("cloudmaplocal_services", "Services.", func(r *region) int { return len(r.st.Services) })
	count("cloudmaplocal_instances", "Registered instances.", func(r *region) int {
		n := 0
		for _, c := range r.ix.nsInstances {
			n += c
		}
		return n
	})
}

package dns

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Handler answers queries from the current index; it never recurses and
// refuses names outside the zone.
type Handler struct {
	index   atomic.Pointer[Index]
	TTL     uint32
	queries *prometheus.CounterVec
	latency prometheus.Histogram
	// writeErrors counts answers that could not be sent.
	writeErrors prometheus.Counter
}

// MaxUDPSize caps UDP answers whatever size a client's EDNS offers (the
// DNS Flag Day 2020 value): a large headless answer over UDP would
// otherwise amplify a spoofed query a hundredfold and fragment; past it
// the answer is truncated (TC) and the client asks again over TCP.
const MaxUDPSize = 1232

// NewHandler makes a handler whose metrics are registered with reg.
func NewHandler(ttl uint32, reg prometheus.Registerer) *Handler {
	h := &Handler{
		TTL: ttl,
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clustermap_dns_queries_total", Help: "DNS queries by type and response code.",
		}, []string{"type", "rcode"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "clustermap_dns_query_duration_seconds", Help: "Time to answer a query.",
			Buckets: []float64{0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005},
		}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clustermap_dns_write_errors_total", Help: "Answers that could not be sent to the client.",
		}),
	}
	if reg != nil {
		reg.MustRegister(h.queries, h.latency, h.writeErrors)
	}
	return h
}

// SetIndex replaces the index atomically.
func (h *Handler) SetIndex(ix *Index) { h.index.Store(ix) }

// ServeDNS implements dns.Handler.
func (h *Handler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	start := time.Now()
	m := h.answer(req)
	size := dns.MinMsgSize
	if w.RemoteAddr().Network() == "tcp" {
		size = dns.MaxMsgSize
	} else if opt := req.IsEdns0(); opt != nil {
		size = min(max(int(opt.UDPSize()), dns.MinMsgSize), MaxUDPSize)
	}
	// Sets the TC bit when the answer does not fit a UDP response.
	m.Truncate(size)
	if err := w.WriteMsg(m); err != nil {
		h.writeErrors.Inc()
	}
	qtype := "none"
	if len(req.Question) == 1 {
		qtype = dns.TypeToString[req.Question[0].Qtype]
	}
	h.queries.WithLabelValues(qtype, dns.RcodeToString[m.Rcode]).Inc()
	h.latency.Observe(time.Since(start).Seconds())
}

func (h *Handler) answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(MaxUDPSize, false)
	}
	ix := h.index.Load()
	if len(req.Question) != 1 || ix == nil {
		m.Rcode = dns.RcodeServerFailure
		if len(req.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
		}
		return m
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET || !ix.InZone(q.Name) {
		// Not an open resolver: nothing outside the zone.
		m.Authoritative = false
		m.Rcode = dns.RcodeRefused
		return m
	}
	if q.Qtype == dns.TypeANY {
		// RFC 8482: no ANY answers.
		m.Rcode = dns.RcodeNotImplemented
		return m
	}
	rrs, exists := ix.Lookup(q.Name, q.Qtype)
	switch {
	case !exists:
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{ix.SOA(h.TTL)}
	case len(rrs) == 0:
		m.Ns = []dns.RR{ix.SOA(h.TTL)} // NODATA
	default:
		m.Answer = rrs
		if rrs[0].Header().Name != q.Name && strings.EqualFold(rrs[0].Header().Name, q.Name) {
			// Answers carry the name as asked (DNS names keep their case).
			m.Answer = make([]dns.RR, len(rrs))
			for i, rr := range rrs {
				m.Answer[i] = dns.Copy(rr)
				m.Answer[i].Header().Name = q.Name
			}
		}
	}
	return m
}

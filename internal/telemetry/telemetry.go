// Package telemetry holds the controller's metrics on Cloud Map, the ones
// operators alert on (docs/troubleshooting.md, the chart's PrometheusRule
// and dashboard): calls by kind of outcome, the last successful sync, time
// lost to the client-side rate limit, and how long an export takes to reach
// an importer. Each mode's own counters stay in its package.
package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
)

var (
	calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clustermap_cloudmap_calls_total",
		Help: "Cloud Map API calls, retries included, by operation, result (ok, throttled, access_denied, not_found, other) and Region.",
	}, []string{"operation", "result", "region"})
	lastSync = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "clustermap_cloudmap_last_sync_timestamp_seconds",
		Help: "When the mode (mcs, cloudmap-dns) last read Cloud Map in the Region successfully, as a Unix time.",
	}, []string{"mode", "region"})
	limitWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "clustermap_cloudmap_ratelimit_wait_seconds",
		Help:    "Time each Cloud Map call waited on the client-side rate limit (--cloudmap-qps, --cloudmap-data-qps), by plane (control, data) and Region.",
		Buckets: []float64{0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"plane", "region"})
	propagation = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "clustermap_mcs_propagation_seconds",
		Help: "From another cluster's write of an export record to this cluster reading it, by the Region read (clocks of both clusters assumed in sync).",
		// The shipped poll is 1.5 s; a change across accounts waits for
		// the exporter's change record too.
		Buckets: []float64{0.5, 1, 2, 3, 5, 7.5, 10, 15, 30, 60, 120, 300},
	}, []string{"region"})
	pollPages = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "clustermap_cloudmap_poll_pages",
		Help: "ListOperations pages each poll of the change feed read, by Region: Cloud Map pages through every operation of the account (other tools' too) before it filters, so a busy account costs more pages.",
		// The shipped budget is 5 pages a poll (--cloudmap-poll-pages).
		Buckets: []float64{1, 2, 3, 4, 5},
	}, []string{"region"})
	duplicates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clustermap_mcs_duplicate_cluster_id_total",
		Help: "Times another cluster's records were found under this cluster's id (two clusters share the id), by Region; reported at most every 10 minutes per service.",
	}, []string{"region"})
)

// Collectors are the metrics, for registration.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{calls, lastSync, limitWait, propagation, duplicates, pollPages}
}

// Modes that sync with Cloud Map.
const (
	ModeMCS         = "mcs"
	ModeCloudMapDNS = "cloudmap-dns"
)

// Call counts one Cloud Map call (an HTTP attempt).
func Call(region, operation string, err error) {
	calls.WithLabelValues(operation, cloudmapclient.ErrorKind(err), region).Inc()
}

// Synced records a successful read of Cloud Map by a mode in a Region.
func Synced(mode, region string, at time.Time) {
	lastSync.WithLabelValues(mode, region).Set(float64(at.UnixNano()) / 1e9)
}

// LimitWait records a call's wait on the client-side rate limit.
func LimitWait(region, plane string, waited time.Duration) {
	limitWait.WithLabelValues(plane, region).Observe(waited.Seconds())
}

// DuplicateClusterID records another cluster's records under this
// cluster's id.
func DuplicateClusterID(region string) { duplicates.WithLabelValues(region).Inc() }

// Reading says a Region is read, so that its counters of what has not
// happened yet exist at zero (an alert on their increase sees the first).
func Reading(region string) { duplicates.WithLabelValues(region) }

// Propagated records how long an export record took to reach this cluster.
func Propagated(region string, took time.Duration) {
	propagation.WithLabelValues(region).Observe(max(took, 0).Seconds())
}

// PollPages records how many ListOperations pages one poll read.
func PollPages(region string, pages int) {
	pollPages.WithLabelValues(region).Observe(float64(pages))
}

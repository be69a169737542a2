//go:build linux

package harness

import (
	"net/http"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// EmulatorCalls reads the emulator's API calls by operation, every result
// included, from its admin endpoint's /metrics.
func EmulatorCalls(t testing.TB, admin string) map[string]float64 {
	t.Helper()
	return emulatorCounts(t, admin, "operation")
}

// EmulatorResults counts the emulator's answers by result code (OK, or the
// error code: RequestLimitExceeded, ServiceUnavailable, RequestTimeout...),
// every operation together.
func EmulatorResults(t testing.TB, admin string) map[string]float64 {
	t.Helper()
	return emulatorCounts(t, admin, "code")
}

func emulatorCounts(t testing.TB, admin, label string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	Must(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	Must(t, err)
	calls := map[string]float64{}
	for _, m := range families["cloudmaplocal_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				calls[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return calls
}

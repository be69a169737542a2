//go:build linux

package harness

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
)

// Written makes an asynchronous write to Cloud Map (write returns its
// operation id) and waits for it to succeed, making it again when Cloud Map
// refuses it as a duplicate of one still running or fails it late, as the
// emulator's aws profile does 1 time in 200 and as a careful script against
// Cloud Map must allow for. It returns the operation's targets.
func Written(t testing.TB, c *sd.Client, write func(ctx context.Context) (*string, error)) map[string]string {
	t.Helper()
	var targets map[string]string
	Eventually(t, 60*time.Second, "a Cloud Map operation that succeeds", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		id, err := write(ctx)
		var busy *types.DuplicateRequest
		if errors.As(err, &busy) {
			return err
		}
		Must(t, err)
		op, err := cloudmapclient.WaitOperation(ctx, c, id)
		if err != nil {
			return err
		}
		targets = op.Targets
		return nil
	})
	return targets
}

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

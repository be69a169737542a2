package harness

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// HeldLog is a logger for the controllers a test runs: it keeps their
// lines and prints them only when the test fails, after what failed. A
// failed test's output then opens with its failure, not with how its
// controllers started (CI shows the opening of a failed test's output).
// Each line carries the seconds since HeldLog was called.
func HeldLog(t testing.TB) logr.Logger {
	var mu sync.Mutex
	var lines []string
	start := time.Now()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		t.Logf("the controllers' log, %d lines (seconds since the test began):\n%s", len(lines), strings.Join(lines, "\n"))
	})
	return funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf("%8.3f %s: %s", time.Since(start).Seconds(), prefix, args))
	}, funcr.Options{})
}

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
// Each line carries its wall-clock time, as tests' own messages do.
func HeldLog(t testing.TB) logr.Logger {
	var mu sync.Mutex
	var lines []string
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		t.Logf("the controllers' log, %d lines:\n%s", len(lines), strings.Join(lines, "\n"))
	})
	return funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf("%s %s: %s", time.Now().Format("15:04:05.000"), prefix, args))
	}, funcr.Options{})
}

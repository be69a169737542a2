//go:build e2e

package bench

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clustermap/clustermap/test/harness"
	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func runtimeCores() int { return runtime.NumCPU() }

// createApp makes a Deployment of replicas pods labelled app=name and a
// Service selecting them on port 80 -> 8080; shape adjusts the Service.
func createApp(ctx context.Context, b *testing.B, cl client.Client, ns, name string, replicas int32, shape func(*corev1.Service)) {
	createAppWith(ctx, b, cl, ns, name, replicas, nil, shape)
}

// createAppWith is createApp with annotations on the pods.
func createAppWith(_ context.Context, b *testing.B, cl client.Client, ns, name string, replicas int32, podAnnotations map[string]string, shape func(*corev1.Service)) {
	harness.CreateApp(b, cl, harness.App{Namespace: ns, Name: name, Replicas: replicas, PodAnnotations: podAnnotations, Shape: shape})
}

// callsBetween sums the emulator's calls between two readings of
// emulatorCalls, and lists them by operation.
func callsBetween(before, after map[string]float64) (total float64, byOp string) {
	var ops []string
	for op, v := range after {
		if d := v - before[op]; d > 0 {
			total += d
			ops = append(ops, fmt.Sprintf("%s %.0f", op, d))
		}
	}
	sort.Strings(ops)
	return total, strings.Join(ops, ", ")
}

// addPod scales a Deployment up by one and waits for the new pod's address
// in the source cluster's EndpointSlices; it returns the address and when
// it appeared there.
func addPod(ctx context.Context, b *testing.B, cl client.Client, source *importTracker, ns, name string) (string, time.Time) {
	old := source.ips(ns + "/" + name)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dep := &appsv1.Deployment{}
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, dep); err != nil {
			return err
		}
		dep.Spec.Replicas = ptr.To(*dep.Spec.Replicas + 1)
		return cl.Update(ctx, dep)
	}); err != nil {
		b.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		for a := range source.ips(ns + "/" + name) {
			if !old[a] {
				return a, time.Now()
			}
		}
		if time.Since(start) > time.Minute {
			b.Fatalf("no new pod address for %s/%s", ns, name)
		}
	}
}

// errorLog is a logger that keeps nothing but a count of the error lines a
// controller logs, by message: a bulk import should log none (conflicts of
// optimistic concurrency are retried quietly).
type errorLog struct {
	mu    sync.Mutex
	byMsg map[string]int
}

func (e *errorLog) logger() logr.Logger { return logr.New(errorSink{e}) }

func (e *errorLog) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var parts []string
	total := 0
	for msg, n := range e.byMsg {
		parts = append(parts, fmt.Sprintf("%q %d", msg, n))
		total += n
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d [%s]", total, strings.Join(parts, ", "))
}

type errorSink struct{ e *errorLog }

func (errorSink) Init(logr.RuntimeInfo)            {}
func (errorSink) Enabled(int) bool                 { return false }
func (errorSink) Info(int, string, ...any)         {}
func (s errorSink) WithValues(...any) logr.LogSink { return s }
func (s errorSink) WithName(string) logr.LogSink   { return s }
func (s errorSink) Error(_ error, msg string, _ ...any) {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if s.e.byMsg == nil {
		s.e.byMsg = map[string]int{}
	}
	s.e.byMsg[msg]++
}

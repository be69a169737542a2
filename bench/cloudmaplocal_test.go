//go:build e2e

// Package bench holds benchmarks that print the numbers the issues ask for.
// Run them with `make bench`.
package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"

	"github.com/clustermap/clustermap/internal/cloudmapclient"
	"github.com/clustermap/clustermap/internal/cloudmaplocal/cloudmaptest"
	"github.com/clustermap/clustermap/internal/devenv"
)

// startEmulator runs `cloudmap-local` as its own process, so that
// its memory is its own, and returns its API URL and pid.
func startEmulator(b *testing.B, args ...string) (string, int) {
	b.Helper()
	bin := filepath.Join(devenv.BinDir(), "cloudmap-local")
	cmd := exec.Command(bin, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("%v (run `make build` first)", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	// "Cloud Map API on http://127.0.0.1:NNN (admin, ...)"
	url := strings.Fields(line)[4]
	return url, cmd.Process.Pid
}

// rssMB reads a process's resident and peak resident memory.
func rssMB(pid int) (rss, peak float64) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(data), "\n") {
		var kb float64
		if _, err := fmt.Sscanf(l, "VmRSS: %f kB", &kb); err == nil {
			rss = kb / 1024
		}
		if _, err := fmt.Sscanf(l, "VmHWM: %f kB", &kb); err == nil {
			peak = kb / 1024
		}
	}
	return
}

// load runs n calls over `workers` goroutines and returns calls per second
// and latency percentiles.
func load(n, workers int, call func(i int) error) (perSec float64, p50, p99 time.Duration, err error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := call(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if e := firstErr.Load(); e != nil {
		err = e.(error)
	}
	return float64(n) / elapsed.Seconds(), lat[n/2], lat[n*99/100], err
}

// BenchmarkCloudMapLocal: 1,000 services x 10 instances registered through
// the real SDK, then DiscoverInstances across them. Targets:
// DiscoverInstances p99 under 1 ms on loopback, at most 100 MB resident.
// It measures the emulator's own speed, not clustermap's, so it runs the
// instant profile: no quota caps the calls it makes and no lag or
// operation time is part of what it times.
func BenchmarkCloudMapLocal(b *testing.B) {
	const namespaces, servicesPerNS, instances, workers = 10, 100, 10, 4
	ctx := context.Background()
	url, pid := startEmulator(b, "--profile", "instant")
	c := cloudmaptest.ClientOf(b, url, cloudmapclient.Options{})
	type svc struct{ ns, name, id string }
	var svcs []svc
	for n := 0; n < namespaces; n++ {
		ns := fmt.Sprintf("bench-%d", n)
		op, err := c.CreateHttpNamespace(ctx, &sd.CreateHttpNamespaceInput{Name: aws.String(ns)})
		if err != nil {
			b.Fatal(err)
		}
		got, err := c.GetOperation(ctx, &sd.GetOperationInput{OperationId: op.OperationId})
		if err != nil {
			b.Fatal(err)
		}
		nsID := got.Operation.Targets["NAMESPACE"]
		for s := 0; s < servicesPerNS; s++ {
			name := fmt.Sprintf("svc-%d", s)
			out, err := c.CreateService(ctx, &sd.CreateServiceInput{Name: aws.String(name), NamespaceId: aws.String(nsID)})
			if err != nil {
				b.Fatal(err)
			}
			svcs = append(svcs, svc{ns, name, aws.ToString(out.Service.Id)})
		}
	}
	b.ResetTimer()
	for range b.N {
		regRate, regP50, regP99, err := load(len(svcs)*instances, workers, func(i int) error {
			s := svcs[i/instances]
			_, err := c.RegisterInstance(ctx, &sd.RegisterInstanceInput{
				ServiceId: aws.String(s.id), InstanceId: aws.String(fmt.Sprintf("tcp-10_0_%d_%d-80", i/250, i%250)),
				Attributes: map[string]string{"AWS_INSTANCE_IPV4": fmt.Sprintf("10.0.%d.%d", i/250, i%250), "AWS_INSTANCE_PORT": "80", "CLUSTER_ID": "cluster-1", "CLUSTERSET_ID": "bench"},
			})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		discover := func(i int) error {
			s := svcs[i%len(svcs)]
			out, err := c.DiscoverInstances(ctx, &sd.DiscoverInstancesInput{NamespaceName: aws.String(s.ns), ServiceName: aws.String(s.name), MaxResults: aws.Int32(1000)})
			if err == nil && len(out.Instances) != instances {
				err = fmt.Errorf("%s/%s: %d instances", s.ns, s.name, len(out.Instances))
			}
			return err
		}
		discRate, discP50, discP99, err := load(50000, workers, discover)
		if err != nil {
			b.Fatal(err)
		}
		// Latency without queueing: one caller at a time.
		_, oneP50, oneP99, err := load(10000, 1, discover)
		if err != nil {
			b.Fatal(err)
		}
		// The emulator alone, as a lean keep-alive HTTP client sees it: the
		// SDK's signing and middleware cost more than the server's answer.
		body := func(i int) string {
			s := svcs[i%len(svcs)]
			return fmt.Sprintf(`{"NamespaceName":%q,"ServiceName":%q,"MaxResults":1000}`, s.ns, s.name)
		}
		_, rawP50, rawP99, err := load(10000, 1, func(i int) error { return rawDiscover(url, body(i)) })
		if err != nil {
			b.Fatal(err)
		}
		rss, peak := rssMB(pid)
		b.ReportMetric(regRate, "register/s")
		b.ReportMetric(float64(regP99.Microseconds()), "register-p99-µs")
		b.ReportMetric(discRate, "discover/s")
		b.ReportMetric(float64(discP99.Microseconds()), "discover-p99-µs")
		b.ReportMetric(float64(oneP99.Microseconds()), "discover-sdk-1-caller-p99-µs")
		b.ReportMetric(float64(rawP99.Microseconds()), "discover-http-1-caller-p99-µs")
		b.ReportMetric(peak, "peak-rss-MB")
		fmt.Printf("cloudmap-local, %d services x %d instances, %d client goroutines, %d cores:\n", len(svcs), instances, workers, runtimeCores())
		fmt.Printf("  RegisterInstance:  %8.0f/s  p50 %v  p99 %v\n", regRate, regP50, regP99)
		fmt.Printf("  DiscoverInstances: %8.0f/s  p50 %v  p99 %v\n", discRate, discP50, discP99)
		fmt.Printf("  DiscoverInstances, one SDK caller:   p50 %v  p99 %v\n", oneP50, oneP99)
		fmt.Printf("  DiscoverInstances, one HTTP caller:  p50 %v  p99 %v\n", rawP50, rawP99)
		fmt.Printf("  emulator memory: %.1f MB resident\n", rss)
		within(b, "DiscoverInstances p99, one HTTP caller", rawP99, time.Millisecond, "the emulator must not be what a benchmark measures")
		atMost(b, "emulator peak memory, MB", peak, 100, "beside the lab's clusters on this machine")
	}
}

var rawClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

func rawDiscover(url, body string) error {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/x-amz-json-1.1")
	req.Header.Set("X-Amz-Target", "Route53AutoNaming_v20170314.DiscoverInstances")
	resp, err := rawClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("DiscoverInstances: HTTP %d", resp.StatusCode)
	}
	return nil
}

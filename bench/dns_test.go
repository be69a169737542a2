//go:build e2e

package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

func freePort(b *testing.B) int {
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			pc.Close()
			return port
		}
	}
}

// startProcess runs a server as its own process (so that its memory is its
// own) and stops it when the benchmark ends.
func startProcess(b *testing.B, name string, args ...string) int {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// waitAnswer waits until the server answers name with an A record.
func waitAnswer(b *testing.B, addr, name string) {
	deadline := time.Now().Add(time.Minute)
	for {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		if r, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, addr); err == nil && len(r.Answer) > 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s does not answer %s", addr, name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type dnsperfResult struct {
	qps       float64
	avg, p99  time.Duration
	completed string
}

// dnsperf runs Debian's dnsperf: at full speed for queries per second, then
// at a fixed rate with -v for the latency distribution.
func dnsperf(b *testing.B, port int, file string) dnsperfResult {
	var r dnsperfResult
	out, err := exec.Command("dnsperf", "-s", "127.0.0.1", "-p", strconv.Itoa(port), "-d", file, "-c", "4", "-l", "10").CombinedOutput()
	if err != nil {
		b.Fatalf("dnsperf: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case strings.HasPrefix(strings.TrimSpace(l), "Queries per second:"):
			r.qps, _ = strconv.ParseFloat(f[len(f)-1], 64)
		case strings.HasPrefix(strings.TrimSpace(l), "Average Latency (s):"):
			s, _ := strconv.ParseFloat(f[3], 64)
			r.avg = time.Duration(s * float64(time.Second))
		case strings.HasPrefix(strings.TrimSpace(l), "Queries completed:"):
			r.completed = strings.Join(f[2:], " ")
		}
	}
	// The per-query lines go to a file, read afterwards: parsing them live
	// would take CPU from the server being measured.
	logPath := filepath.Join(b.TempDir(), "dnsperf-v.txt")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("dnsperf", "-s", "127.0.0.1", "-p", strconv.Itoa(port), "-d", file, "-c", "4", "-l", "5", "-Q", "20000", "-v")
	cmd.Stdout = logFile
	if err := cmd.Run(); err != nil {
		b.Fatal(err)
	}
	logFile.Close()
	logFile, _ = os.Open(logPath)
	defer logFile.Close()
	var lat []time.Duration
	sc := bufio.NewScanner(logFile)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 5 && f[0] == ">" {
			s, _ := strconv.ParseFloat(f[4], 64)
			lat = append(lat, time.Duration(s*float64(time.Second)))
		}
	}
	if len(lat) == 0 {
		b.Fatal("dnsperf -v printed no latencies")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	r.p99 = lat[len(lat)*99/100]
	return r
}

// BenchmarkDNS: 1,000 ClusterSetIP imports served by clustermap dns and by
// stock CoreDNS (kubernetes plugin, multicluster option), loaded by dnsperf
// on loopback. Targets: more queries per second than CoreDNS,
// p99 under 2 ms, under 100 MB resident.
func BenchmarkDNS(b *testing.B) {
	const imports = 1000
	bin := devenv.BinDir()
	if _, err := exec.LookPath("dnsperf"); err != nil {
		b.Fatal("dnsperf is missing: apt-get install dnsperf (make bench does)")
	}
	coredns := filepath.Join(bin, "coredns")
	if _, err := os.Stat(coredns); err != nil {
		b.Fatal("bin/coredns is missing: make bench builds it")
	}
	env := harness.Clusters(b, 1)
	cl := harness.Client(b, env.Clusters[0].Config)
	ctx := context.Background()
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}); err != nil {
		b.Fatal(err)
	}
	var aQueries, srvQueries []string
	for i := 0; i < imports; i++ {
		name := fmt.Sprintf("svc-%d", i)
		if err := cl.Create(ctx, &mcsv1beta1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench"}, Spec: mcsv1beta1.ServiceImportSpec{
			Type: mcsv1beta1.ClusterSetIP, IPs: []string{fmt.Sprintf("10.201.%d.%d", i/250, i%250+1)},
			Ports: []mcsv1beta1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}},
		}}); err != nil {
			b.Fatal(err)
		}
		aQueries = append(aQueries, fmt.Sprintf("%s.bench.svc.clusterset.local A", name))
		srvQueries = append(srvQueries, fmt.Sprintf("_http._tcp.%s.bench.svc.clusterset.local SRV", name))
	}
	dir := b.TempDir()
	files := map[string]string{"A": filepath.Join(dir, "a.txt"), "SRV": filepath.Join(dir, "srv.txt")}
	_ = os.WriteFile(files["A"], []byte(strings.Join(aQueries, "\n")+"\n"), 0o644)
	_ = os.WriteFile(files["SRV"], []byte(strings.Join(srvQueries, "\n")+"\n"), 0o644)

	ours := freePort(b)
	oursPid := startProcess(b, filepath.Join(bin, "clustermap"), "dns", "--listen", fmt.Sprintf("127.0.0.1:%d", ours),
		"--kubeconfig", env.Kubeconfig, "--context", "cluster-1", "--health-address", "0")
	theirs := freePort(b)
	corefile := filepath.Join(dir, "Corefile")
	_ = os.WriteFile(corefile, []byte(fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    kubernetes cluster.local clusterset.local {
        kubeconfig %s cluster-1
        multicluster clusterset.local
    }
}
`, theirs, env.Kubeconfig)), 0o644)
	corednsPid := startProcess(b, coredns, "-conf", corefile)
	last := fmt.Sprintf("svc-%d.bench.svc.clusterset.local.", imports-1)
	waitAnswer(b, fmt.Sprintf("127.0.0.1:%d", ours), last)
	waitAnswer(b, fmt.Sprintf("127.0.0.1:%d", theirs), last)

	b.ResetTimer()
	fmt.Printf("clusterset.local DNS, %d ClusterSetIP imports, dnsperf -c 4 on loopback, %d cores:\n", imports, runtimeCores())
	for _, qt := range []string{"A", "SRV"} {
		for _, s := range []struct {
			name string
			port int
		}{{"clustermap dns", ours}, {"CoreDNS 1.13.1", theirs}} {
			r := dnsperf(b, s.port, files[qt])
			fmt.Printf("  %-4s %-15s %8.0f queries/s  avg %v  p99 at 20,000/s %v  (%s)\n", qt, s.name, r.qps, r.avg, r.p99, r.completed)
			if s.port == ours {
				b.ReportMetric(r.qps, qt+"-qps")
				b.ReportMetric(float64(r.p99.Microseconds()), qt+"-p99-µs")
			} else {
				b.ReportMetric(r.qps, qt+"-coredns-qps")
			}
		}
	}
	rss, peak := rssMB(oursPid)
	crss, cpeak := rssMB(corednsPid)
	fmt.Printf("  memory: clustermap dns %.1f MB resident (%.1f peak), CoreDNS %.1f MB (%.1f peak)\n", rss, peak, crss, cpeak)
	b.ReportMetric(peak, "peak-rss-MB")
}

package verify

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/clustermap/clustermap/internal/probe"
)

var (
	one = Cluster{Context: "ctx-1", ID: "cluster-1", PodIPs: []string{"10.1.0.5", "fd00:1::5"}, Imported: true, HeadlessImported: true,
		ImportIPs: []string{"10.201.0.9", "fd00:201::9"}, ImportClusters: []string{"cluster-1", "cluster-2"}}
	two = Cluster{Context: "ctx-2", ID: "cluster-2", PodIPs: []string{"10.2.0.7"}, Imported: true, HeadlessImported: true,
		ImportIPs: []string{"10.202.0.3"}, ImportClusters: []string{"cluster-1", "cluster-2"}}
)

// pass is what a working clusterset answers to each item.
func pass(items []Item) []probe.Result {
	out := make([]probe.Result, len(items))
	for i, it := range items {
		out[i] = probe.Result{Answers: it.Want}
		if it.Want == nil {
			out[i].Answers = []string{"1.1.0"}
		}
	}
	return out
}

func TestChecks(t *testing.T) {
	items := Checks("clusterset.local", "v", one, []Cluster{one, two})
	var whats []string
	for _, it := range items {
		whats = append(whats, it.Target+": "+it.What)
	}
	for _, want := range []string{
		": the DNS server answers (dns-version TXT)",
		": A probe.v.svc.clusterset.local",
		": AAAA probe.v.svc.clusterset.local",
		": A probe-headless.v.svc.clusterset.local",
		": tcp to the clusterset IP 10.201.0.9",
		": udp to the clusterset IP fd00:201::9",
		": SRV _probe._tcp.probe.v.svc.clusterset.local",
		"cluster-2: A probe.cluster-2.probe-headless.v.svc.clusterset.local",
		"cluster-2: tcp to the pod 10.2.0.7",
		"cluster-2: udp to the pod 10.2.0.7",
		"cluster-1: udp to the pod fd00:1::5",
	} {
		if !slices.Contains(whats, want) {
			t.Errorf("no check %q in\n%s", want, strings.Join(whats, "\n"))
		}
	}
	// cluster-2 has no IPv6: nothing of it is looked up or dialled in IPv6.
	if slices.Contains(whats, "cluster-2: AAAA probe.cluster-2.probe-headless.v.svc.clusterset.local") {
		t.Error("an IPv6 check of an IPv4-only cluster")
	}
	for _, it := range items {
		if it.Via && it.Check.Addr == "[fd00:201::9]:8080" && !slices.Equal(it.Want, []string{"cluster-1"}) {
			t.Errorf("the IPv6 clusterset IP must reach only cluster-1: %v", it.Want)
		}
	}
	if f := Diagnose(one, items, pass(items)); len(f) != 0 {
		t.Errorf("failures where all passed: %+v", f)
	}
}

// Each kind of miss gets its likely cause.
func TestDiagnose(t *testing.T) {
	items := Checks("clusterset.local", "v", one, []Cluster{one, two})
	find := func(what string) int {
		for i, it := range items {
			if it.What == what {
				return i
			}
		}
		t.Fatalf("no item %q", what)
		return -1
	}
	for _, c := range []struct {
		name            string
		src             Cluster
		breakIt         func(r []probe.Result)
		to, what, cause string
	}{
		{"route", one, func(r []probe.Result) {
			r[find("tcp to the pod 10.2.0.7")] = probe.Result{Failed: 1, Class: probe.Unreachable}
			r[find("udp to the pod 10.2.0.7")] = probe.Result{Failed: 1, Class: probe.Timeout}
		}, "cluster-2", "tcp to the pod 10.2.0.7", "route: cluster-1 has no route"},
		{"dropped", one, func(r []probe.Result) {
			r[find("tcp to the pod 10.2.0.7")] = probe.Result{Failed: 1, Class: probe.Timeout}
			r[find("udp to the pod 10.2.0.7")] = probe.Result{Failed: 1, Class: probe.Timeout}
		}, "cluster-2", "tcp to the pod 10.2.0.7", "route or security group"},
		{"firewall", one, func(r []probe.Result) {
			r[find("udp to the pod 10.2.0.7")] = probe.Result{Failed: 1, Class: probe.Timeout}
		}, "cluster-2", "udp to the pod 10.2.0.7", "firewall: UDP 8080"},
		{"service proxy", one, func(r []probe.Result) {
			r[find("tcp to the clusterset IP 10.201.0.9")] = probe.Result{Answers: []string{"cluster-1"}}
		}, "cluster-2", "tcp to the clusterset IP 10.201.0.9", "service proxy"},
		{"no forward", one, func(r []probe.Result) {
			r[find("the DNS server answers (dns-version TXT)")] = probe.Result{Failed: 1, Class: probe.NXDomain}
			r[find("A probe.v.svc.clusterset.local")] = probe.Result{Failed: 1, Class: probe.NXDomain}
		}, "", "the DNS server answers (dns-version TXT)", "DNS forward: cluster-1's cluster DNS"},
		{"import missing", func() Cluster { c := one; c.Imported = false; return c }(), func(r []probe.Result) {
			r[find("A probe.v.svc.clusterset.local")] = probe.Result{Failed: 1, Class: probe.NXDomain}
		}, "", "A probe.v.svc.clusterset.local", "import missing: cluster-1 has no ServiceImport"},
		{"import incomplete", func() Cluster { c := one; c.ImportClusters = []string{"cluster-1"}; return c }(), func(r []probe.Result) {
			r[find("A probe.cluster-2.probe-headless.v.svc.clusterset.local")] = probe.Result{Failed: 1, Class: probe.NXDomain}
		}, "cluster-2", "A probe.cluster-2.probe-headless.v.svc.clusterset.local", "import incomplete: cluster-1's import does not list cluster-2"},
	} {
		r := pass(items)
		c.breakIt(r)
		f := Diagnose(c.src, items, r)
		i := slices.IndexFunc(f, func(f Failure) bool { return f.What == c.what })
		if i < 0 || f[i].To != c.to || !strings.HasPrefix(f[i].Cause, c.cause) {
			t.Errorf("%s: %+v, want %q -> %q: %q...", c.name, f, c.what, c.to, c.cause)
		}
	}
}

func TestTable(t *testing.T) {
	rep := Report{Clusters: []Cluster{one, two}, Checks: 40, Failures: []Failure{
		{From: "cluster-1", To: "cluster-2", What: "tcp to the pod 10.2.0.7", Got: "timeout", Cause: "route or security group"}}}
	var b bytes.Buffer
	if err := Table(&b, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"FROM \\ TO  NAMES  cluster-1  cluster-2",
		"cluster-1  ok     ok         FAIL(1)",
		"cluster-2  ok     ok         ok",
		"40 checks, 1 failed",
		"cluster-1 -> cluster-2: tcp to the pod 10.2.0.7\n  got:    timeout\n  likely: route or security group",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

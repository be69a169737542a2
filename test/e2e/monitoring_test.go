//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/supervise"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/test/harness"
)

const (
	alertsFile     = "../../charts/clustermap/files/monitoring/alerts.yaml"
	alertTestsFile = "../monitoring/alerts_test.yaml"
	dashboardFile  = "../../charts/clustermap/files/monitoring/dashboard.json"
	runbookFile    = "../../docs/troubleshooting.md"
)

// ruleFile is the part of a Prometheus rule file the checks read.
type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string
			Expr        string
			Annotations map[string]string
		}
	}
}

func loadRules(t *testing.T) ruleFile {
	var rf ruleFile
	readInto(t, alertsFile, &rf)
	return rf
}

// readInto decodes a YAML (or JSON) file into v.
func readInto(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	harness.Must(t, err)
	harness.Must(t, yaml.Unmarshal(raw, v))
}

// TestAlertRules runs Prometheus's own rule checks and unit tests (the
// pinned promtool), and holds every alert to a test of its own and to a
// runbook section that exists.
func TestAlertRules(t *testing.T) {
	promtool := filepath.Join(devenv.BinDir(), "promtool")
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertTestsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
	tests, err := os.ReadFile(alertTestsFile)
	harness.Must(t, err)
	runbook, err := os.ReadFile(runbookFile)
	harness.Must(t, err)
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(runbook), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if !strings.Contains(string(tests), "alertname: "+r.Alert+"\n") {
				t.Errorf("alert %s has no promtool test in %s", r.Alert, alertTestsFile)
			}
			_, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "/docs/troubleshooting.md#")
			if anchor == "" || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q has no section (### %s) in docs/troubleshooting.md", r.Alert, r.Annotations["runbook_url"], r.Alert)
			}
		}
	}
}

// dashboard is the part of the Grafana dashboard the checks read.
type dashboard struct {
	Templating struct {
		List []struct {
			Name, Type string
			Query      any
			Datasource any
		}
	}
	Panels []struct {
		Title, Type string
		Datasource  map[string]string
		Targets     []struct {
			Expr       string
			Datasource map[string]string
		}
	}
}

func loadDashboard(t *testing.T) dashboard {
	var d dashboard
	readInto(t, dashboardFile, &d)
	return d
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`)

// queries are every PromQL expression of the alerts and the dashboard
// (panels' targets, and the selector inside each label_values variable).
func queries(t *testing.T) (alerts, panels, variables []string) {
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Expr)
		}
	}
	d := loadDashboard(t)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			panels = append(panels, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		if m := labelValues.FindStringSubmatch(s); m != nil {
			variables = append(variables, m[1])
		}
	}
	return alerts, panels, variables
}

// parsed is promqlcheck's answer for one expression.
type parsed struct {
	Expr      string
	Metrics   []string
	Selectors [][]string
	Error     string
}

func promqlcheck(t *testing.T, exprs []string) []parsed {
	t.Helper()
	in, _ := json.Marshal(exprs)
	cmd := exec.Command(filepath.Join(devenv.BinDir(), "promqlcheck"))
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	harness.Must(t, err)
	var res []parsed
	harness.Must(t, json.Unmarshal(out, &res))
	return res
}

// TestDashboardLint applies the rules of Grafana's dashboard linter
// (grafana/dashboard-linter: the module proxy refuses that module, so its
// documented rules are checked here): a templated Prometheus data source
// used by every panel and target, job and instance variables matched by
// every query, $__rate_interval in every range, and PromQL that parses;
// and this project's own: a cluster variable matched by every query, so
// that one Prometheus over many clusters shows one at a time.
func TestDashboardLint(t *testing.T) {
	d := loadDashboard(t)
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && fmt.Sprint(v.Datasource) != fmt.Sprint(map[string]any{"type": "prometheus", "uid": "${datasource}"}) {
			t.Errorf("variable %s: data source %v, want the templated one", v.Name, v.Datasource)
		}
	}
	if vars["datasource"] != "datasource" || vars["cluster"] != "query" || vars["job"] != "query" || vars["instance"] != "query" {
		t.Errorf("template variables %v: want datasource (a data source), cluster, job and instance (queries)", vars)
	}
	ds := map[string]string{"type": "prometheus", "uid": "${datasource}"}
	var exprs []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if !maps.Equal(p.Datasource, ds) {
			t.Errorf("panel %q: data source %v, want %v", p.Title, p.Datasource, ds)
		}
		for _, tg := range p.Targets {
			if !maps.Equal(tg.Datasource, ds) {
				t.Errorf("panel %q: a target's data source %v, want %v", p.Title, tg.Datasource, ds)
			}
			for _, r := range regexp.MustCompile(`\[([^\]]*)\]`).FindAllStringSubmatch(tg.Expr, -1) {
				if r[1] != "$__rate_interval" {
					t.Errorf("panel %q: range [%s], want [$__rate_interval]: %s", p.Title, r[1], tg.Expr)
				}
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, r := range promqlcheck(t, exprs) {
		if r.Error != "" {
			t.Errorf("%s: %s", r.Expr, r.Error)
		}
		for _, sel := range r.Selectors {
			if !slices.Contains(sel, "cluster") || !slices.Contains(sel, "job") || !slices.Contains(sel, "instance") {
				t.Errorf("a selector of %s matches %v: want cluster, job and instance matchers", r.Expr, sel)
			}
		}
	}
}

// TestMonitoringNamesRealMetrics runs the real binaries (the controller in
// every mode, and the DNS server), makes them do what each metric counts
// (an export read from another cluster, a replication peer, a DNS query),
// reads their /metrics, and holds every PromQL expression of the alerts
// and the dashboard to it: each parses (Prometheus's parser) and names
// only metrics the binaries export.
func TestMonitoringNamesRealMetrics(t *testing.T) {
	inParallel(t)
	w := newWorld(t, worldOptions{Options: devenv.Options{Clusters: 2}})
	const ns = "mon"
	w.allNamespaces(t, ns)
	dir := t.TempDir()
	peers, err := w.env.PeerDirs(context.Background(), filepath.Join(dir, "peers"), replication.PeerAccess{})
	harness.Must(t, err)
	env := []string{"AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local"}
	bin := filepath.Join(devenv.BinDir(), "clustermap")
	var scrape []string
	for _, c := range w.env.Clusters {
		metrics := harness.FreeAddr(t)
		scrape = append(scrape, "http://"+metrics+"/metrics")
		p := &supervise.Process{Name: c.ID, Env: env, Log: filepath.Join(dir, c.ID+".log"), Argv: []string{bin, "controller",
			"--kubeconfig", w.env.Kubeconfig, "--context", c.ID, "--cloudmap-endpoint", w.cm.URL, "--region", "us-east-1",
			"--cloudmap-dns", "--syndicate", "--peers-dir", peers[c.ID], "--cluster-name", c.ID, "--namespaces", ns,
			"--metrics-bind-address", metrics, "--health-probe-bind-address", "0"}}
		p.Start()
		t.Cleanup(p.Stop)
	}
	dnsAddr, dnsHealth := harness.FreeAddr(t), harness.FreeAddr(t)
	scrape = append(scrape, "http://"+dnsHealth+"/metrics")
	p := &supervise.Process{Name: "dns", Env: env, Log: filepath.Join(dir, "dns.log"), Argv: []string{bin, "dns",
		"--kubeconfig", w.env.Kubeconfig, "--context", "cluster-2", "--listen", dnsAddr, "--health-address", dnsHealth}}
	p.Start()
	t.Cleanup(p.Stop)

	// Exported once both controllers run: cluster-2 reads a registration
	// written after it started, which is what propagation measures.
	harness.Eventually(t, 60*time.Second, "both controllers serve /metrics", func() error {
		_, err := exported(scrape[:2])
		return err
	})
	w.exportApp(t, ns, "web", 2)
	harness.Eventually(t, 60*time.Second, "a DNS answer and every metric the monitoring reads", func() error {
		q := new(dns.Msg)
		q.SetQuestion("web."+ns+".svc.clusterset.local.", dns.TypeA)
		if _, err := dns.Exchange(q, dnsAddr); err != nil {
			return err
		}
		names, err := exported(scrape)
		if err != nil {
			return err
		}
		for _, want := range []string{"clustermap_mcs_propagation_seconds_count", "clustermap_syndicate_peer_up", "clustermap_dns_queries_total",
			"clustermap_cloudmap_last_sync_timestamp_seconds", "clustermap_cloudmap_ratelimit_wait_seconds_sum"} {
			if !names[want] {
				return fmt.Errorf("no %s yet", want)
			}
		}
		return nil
	})
	names, err := exported(scrape)
	harness.Must(t, err)
	alerts, panels, variables := queries(t)
	used := map[string]bool{}
	for _, r := range promqlcheck(t, slices.Concat(alerts, panels, variables)) {
		if r.Error != "" {
			t.Errorf("does not parse: %s: %s", r.Expr, r.Error)
		}
		for _, m := range r.Metrics {
			used[m] = true
			if !names[m] {
				t.Errorf("%s names %s, which no binary exports", r.Expr, m)
			}
		}
	}
	t.Logf("the alerts (%d) and the dashboard (%d panels' queries, %d variables) read %d metrics: %v",
		len(alerts), len(panels), len(variables), len(used), slices.Sorted(maps.Keys(used)))
}

// exported reads every sample name the /metrics endpoints expose.
func exported(urls []string) (map[string]bool, error) {
	names := map[string]bool{}
	for _, u := range urls {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			return nil, err
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u, err)
		}
		for name, f := range families {
			names[name] = true
			switch f.GetType().String() {
			case "HISTOGRAM":
				names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
			case "SUMMARY":
				names[name+"_sum"], names[name+"_count"] = true, true
			}
		}
	}
	return names, nil
}

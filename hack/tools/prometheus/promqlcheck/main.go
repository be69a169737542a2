// Command promqlcheck parses PromQL expressions with Prometheus's own parser
// and prints, for each, the metric names it selects: the tests hold the
// chart's alerts and dashboard to the metrics clustermap really exports.
// Input: a JSON list of expressions on stdin; output: a JSON list of
// {"expr", "metrics", "selectors", "error"} in the same order; each
// selector lists the labels it matches on (a dashboard linter's job and
// instance rule reads them).
package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr      string     `json:"expr"`
	Metrics   []string   `json:"metrics"`
	Selectors [][]string `json:"selectors"`
	Error     string     `json:"error,omitempty"`
}

// grafanaVars are Grafana's interval variables, replaced by a duration so
// that a dashboard's query parses as Grafana sends it.
var grafanaVars = regexp.MustCompile(`\$__(rate_interval|interval|range)|\$\{__(rate_interval|interval|range)\}`)

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		os.Stderr.WriteString("promqlcheck: " + err.Error() + "\n")
		os.Exit(2)
	}
	out := make([]result, 0, len(exprs))
	for _, e := range exprs {
		r := result{Expr: e, Metrics: []string{}, Selectors: [][]string{}}
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.ReplaceAllString(e, "5m"))
		if err != nil {
			r.Error = err.Error()
		} else {
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok {
					names := []string{}
					for _, m := range vs.LabelMatchers {
						names = append(names, m.Name)
						if m.Name == labels.MetricName && m.Type == labels.MatchEqual && !slices.Contains(r.Metrics, m.Value) {
							r.Metrics = append(r.Metrics, m.Value)
						}
					}
					r.Selectors = append(r.Selectors, names)
				}
				return nil
			})
		}
		out = append(out, r)
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}

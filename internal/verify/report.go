package verify

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/clustermap/clustermap/internal/probe"
)

// Failure is a check that did not find what it must, with its likely
// cause. To is the cluster it is about ("" for the clusterset's names).
type Failure struct {
	From  string `json:"from"`
	To    string `json:"to"`
	What  string `json:"what"`
	Got   string `json:"got"`
	Cause string `json:"cause"`
}

// Report is a whole run: the clusters, how many checks ran, what failed.
type Report struct {
	Namespace string    `json:"namespace"`
	Clusters  []Cluster `json:"clusters"`
	Checks    int       `json:"checks"`
	Failures  []Failure `json:"failures"`
}

// Diagnose compares each result from cluster src with its item and names
// the likely cause of each miss: DNS not forwarded, an import missing or
// incomplete, a route or a firewall, the Service proxy.
func Diagnose(src Cluster, items []Item, results []probe.Result) []Failure {
	if len(results) != len(items) {
		return []Failure{{From: src.ID, What: "the checks", Got: fmt.Sprintf("%d results for %d checks", len(results), len(items)),
			Cause: "the probe in " + src.ID + " did not run the plan: is its image this version of clustermap?"}}
	}
	var out []Failure
	forwarded := true
	direct := map[string]bool{} // "tcp cluster-2": a direct dial that failed
	for i, it := range items {
		if it.Check.Kind != "dns" && !it.Via && !dialOK(it, results[i]) {
			direct[it.Check.Kind+" "+it.Target] = true
		}
		if it.Check.Type == "TXT" && results[i].Class != "" {
			forwarded = false
		}
	}
	fail := func(it Item, to, got, cause string) {
		out = append(out, Failure{From: src.ID, To: to, What: it.What, Got: got, Cause: cause})
	}
	for i, it := range items {
		r := results[i]
		switch {
		case it.Check.Kind == "dns":
			if r.Class == "" && (it.Want == nil || slices.Equal(r.Answers, it.Want)) {
				continue
			}
			fail(it, it.Target, got(r), dnsCause(src, it, r, forwarded))
		case it.Via:
			for _, to := range it.Want {
				if slices.Contains(r.Answers, to) {
					continue
				}
				fail(it, to, got(r), viaCause(src, it, to, direct[it.Check.Kind+" "+to]))
			}
			for _, a := range r.Answers {
				if !slices.Contains(it.Want, a) {
					fail(it, a, got(r), "answered from "+a+", which runs no ready probe: two clusters with one id, or a stale import")
				}
			}
		case !dialOK(it, r):
			fail(it, it.Target, got(r), dialCause(src, it, r, items, results))
		}
	}
	return out
}

func dialOK(it Item, r probe.Result) bool {
	return r.Failed == 0 && slices.Equal(r.Answers, it.Want)
}

func got(r probe.Result) string {
	switch {
	case r.Class != "" && len(r.Answers) > 0:
		return fmt.Sprintf("%v, and %d failed (%s: %s)", r.Answers, r.Failed, r.Class, r.Error)
	case r.Class != "":
		return r.Class + ": " + r.Error
	case len(r.Answers) == 0:
		return "nothing"
	}
	return strings.Join(r.Answers, ", ")
}

func dnsCause(src Cluster, it Item, r probe.Result, forwarded bool) string {
	headless := strings.Contains(it.Check.Name, Headless+".")
	switch {
	case !forwarded && it.Check.Type == "TXT":
		return fmt.Sprintf("DNS forward: %s's cluster DNS does not answer for the clusterset zone: forward it to clustermap's DNS server (the chart's NOTES print the Corefile block)", src.ID)
	case !forwarded:
		return "DNS forward (above)"
	case !headless && !src.Imported, headless && !src.HeadlessImported:
		return fmt.Sprintf("import missing: %s has no ServiceImport of the probe: is its controller running, reading the clusterset's Cloud Map namespace? (clustermap status --context %s)", src.ID, src.Context)
	case it.Target != "" && !slices.Contains(src.ImportClusters, it.Target):
		return fmt.Sprintf("import incomplete: %s's import does not list %s: %s's export is not in Cloud Map yet, or %s cannot read it", src.ID, it.Target, it.Target, src.ID)
	case r.Class == "":
		return fmt.Sprintf("DNS answers differ from the import (want %s): the DNS server lags the ServiceImports, or runs in another cluster", strings.Join(it.Want, ", "))
	}
	return fmt.Sprintf("DNS: clustermap's DNS server of %s fails on this name (%s): see its logs", src.ID, r.Class)
}

func viaCause(src Cluster, it Item, to string, directFailed bool) string {
	switch {
	case directFailed:
		return fmt.Sprintf("%s's pods are unreachable from %s directly too (below)", to, src.ID)
	case !src.Imported:
		return fmt.Sprintf("import missing: %s has no ServiceImport of the probe (clustermap status --context %s)", src.ID, src.Context)
	case !slices.Contains(src.ImportClusters, to):
		return fmt.Sprintf("import incomplete: %s's import does not list %s yet", src.ID, to)
	}
	return fmt.Sprintf("service proxy: %s's pods answer directly but not through the clusterset IP: the Service proxy of %s (kube-proxy, or the CNI's) does not send the imported Service's traffic to them", to, src.ID)
}

func dialCause(src Cluster, it Item, r probe.Result, items []Item, results []probe.Result) string {
	other := map[string]string{"tcp": "udp", "udp": "tcp"}[it.Check.Kind]
	otherOK := false
	for i, o := range items {
		if o.Check.Kind == other && o.Check.Addr == it.Check.Addr && dialOK(o, results[i]) {
			otherOK = true
		}
	}
	proto := strings.ToUpper(it.Check.Kind)
	switch {
	case r.Failed == 0:
		return fmt.Sprintf("another cluster answered at %s's address: overlapping pod ranges?", it.Target)
	case otherOK && r.Class != probe.Unreachable:
		return fmt.Sprintf("firewall: %s %d to %s's pods is dropped while %s passes: a security group, NACL or NetworkPolicy allows one protocol only", proto, Port, it.Target, strings.ToUpper(other))
	case r.Class == probe.Unreachable:
		return fmt.Sprintf("route: %s has no route to %s's pod range (route tables, VPC peering or transit gateway)", src.ID, it.Target)
	case r.Class == probe.Timeout:
		return fmt.Sprintf("route or security group: packets from %s's pods to %s's pods are dropped (a missing route, or a security group or NACL not allowing %s %d from %s's pod range)", src.ID, it.Target, proto, Port, src.ID)
	case r.Class == probe.Refused:
		return fmt.Sprintf("refused: nothing listens on %d at %s's probe, or a NetworkPolicy rejects it", Port, it.Target)
	}
	return fmt.Sprintf("something other than the probe answers at %s: overlapping pod ranges?", it.Check.Addr)
}

// Table prints the matrix (rows from, columns to, the clusterset's names
// in the first column) and then every failure with its likely cause.
func Table(w io.Writer, rep Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := []string{"FROM \\ TO", "NAMES"}
	for _, c := range rep.Clusters {
		head = append(head, c.ID)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	count := map[[2]string]int{}
	for _, f := range rep.Failures {
		count[[2]string{f.From, f.To}]++
	}
	cell := func(from, to string) string {
		if n := count[[2]string{from, to}]; n > 0 {
			return fmt.Sprintf("FAIL(%d)", n)
		}
		return "ok"
	}
	for _, from := range rep.Clusters {
		row := []string{from.ID}
		if from.Error != "" {
			row = append(row, "not run: "+from.Error)
		} else {
			row = append(row, cell(from.ID, ""))
			for _, to := range rep.Clusters {
				row = append(row, cell(from.ID, to.ID))
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n%d checks, %d failed\n", rep.Checks, len(rep.Failures))
	for _, f := range rep.Failures {
		to := f.To
		if to == "" {
			to = "clusterset"
		}
		fmt.Fprintf(w, "\n%s -> %s: %s\n  got:    %s\n  likely: %s\n", f.From, to, f.What, f.Got, f.Cause)
	}
	return nil
}

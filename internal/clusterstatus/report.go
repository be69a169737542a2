// Package clusterstatus is `clustermap status`: what each cluster of a
// clusterset holds and whether anything is stuck. Gather reads a cluster
// (the adapter); Summarize, pure, turns what was read into the report;
// Table and JSON print it.
package clusterstatus

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
	"github.com/clustermap/clustermap/internal/registry"
	"github.com/clustermap/clustermap/internal/statuslease"
)

// Cluster is one cluster's part of the report.
type Cluster struct {
	Context    string      `json:"context"`
	Error      string      `json:"error,omitempty"` // the cluster could not be read
	ClusterID  string      `json:"clusterID,omitempty"`
	ClusterSet string      `json:"clusterSet,omitempty"`
	Controller *Controller `json:"controller,omitempty"`
	Exports    []Export    `json:"exports"`
	Imports    []Import    `json:"imports"`
	Stuck      []string    `json:"stuck"`
	// Failing are exports and imports whose conditions say they fail
	// (Valid or Ready False; an import's removal held, or its endpoints
	// capped).
	Failing []string `json:"failing"`
	// Notes are worth knowing and not wrong.
	Notes []string `json:"notes,omitempty"`
}

// Controller is what the controller last published in its status Lease.
type Controller struct {
	Holder string `json:"holder"`
	// Namespace holds its status Lease.
	Namespace     string     `json:"namespace"`
	Version       string     `json:"version"`
	Modes         []string   `json:"modes"`
	LastReport    time.Time  `json:"lastReport"`
	LastCloudMap  *time.Time `json:"lastCloudMapSync,omitempty"`
	CloudMapError string     `json:"cloudMapError,omitempty"`
	// Sources is each Cloud Map Region (and account) read: its last sync
	// and error.
	Sources   map[string]statuslease.Source `json:"cloudMapSources,omitempty"`
	PeersDown []string                      `json:"peersDown,omitempty"`
	// RecordFormat is how the cluster writes its Cloud Map endpoint
	// records, and why.
	RecordFormat string `json:"recordFormat,omitempty"`
	// Instances is the fullest Cloud Map service and namespace against
	// their quotas.
	Instances string `json:"cloudMapInstances,omitempty"`
	// Proofs is every exporting cluster's last proof of life as read here,
	// and whether it is drained.
	Proofs map[string]statuslease.Proof `json:"clusterProofs,omitempty"`
}

// Registry names the registry the controller reads (the JSON fields keep
// their Cloud Map names, which a hub's reads fill too).
func (c *Controller) Registry() string {
	if _, ok := c.Sources[statuslease.HubSource]; ok {
		return registry.Hub
	}
	return registry.CloudMap
}

// Export is a ServiceExport and its conditions ("True/Exported").
type Export struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Valid     string `json:"valid"`
	Ready     string `json:"ready"`
	Conflict  string `json:"conflict"`
}

// Import is a ServiceImport, its exporting clusters and its ready
// endpoints per address family.
type Import struct {
	Namespace string         `json:"namespace"`
	Name      string         `json:"name"`
	Type      string         `json:"type"`
	IPs       []string       `json:"ips,omitempty"`
	Clusters  []string       `json:"clusters"`
	Ready     map[string]int `json:"readyEndpoints"`
}

// Read is what Gather read of one cluster.
type Read struct {
	Context               string
	ClusterID, ClusterSet string
	// StatusNamespace is where the status Lease was looked for; Lease is
	// the one found there or, failing that, the only one in any namespace.
	StatusNamespace string
	Lease           *coordinationv1.Lease
	// Without a Lease: whether StatusNamespace is missing, and the Leases
	// of several controllers found elsewhere.
	StatusNamespaceMissing bool
	LeasesElsewhere        []coordinationv1.Lease
	Exports                []mcsv1beta1.ServiceExport
	Imports                []mcsv1beta1.ServiceImport
	Slices                 []discoveryv1.EndpointSlice // clustermap's
	Services               []corev1.Service            // with clustermap's finalizer or condition
}

// StuckAfter is how long a deletion may wait on a finalizer before it is
// reported stuck.
const StuckAfter = time.Minute

// Summarize builds a cluster's report from what was read, at now.
func Summarize(r Read, now time.Time) Cluster {
	c := Cluster{Context: r.Context, ClusterID: r.ClusterID, ClusterSet: r.ClusterSet, Exports: []Export{}, Imports: []Import{}, Stuck: []string{}, Failing: []string{}}
	if r.ClusterID == "" || r.ClusterSet == "" {
		c.Stuck = append(c.Stuck, "cluster identity not set: create the ClusterProperties cluster.clusterset.k8s.io and clusterset.k8s.io")
	}
	if r.Lease == nil {
		c.Stuck = append(c.Stuck, noController(r))
	} else {
		c.Controller = controllerOf(r.Lease)
		ctl := c.Controller
		if ctl.Namespace != r.StatusNamespace {
			c.Notes = append(c.Notes, fmt.Sprintf("the controller's status is in namespace %s, not %s: pass --status-namespace %s", ctl.Namespace, r.StatusNamespace, ctl.Namespace))
		}
		if beat := heartbeat(r.Lease); now.Sub(ctl.LastReport) > 3*beat {
			c.Stuck = append(c.Stuck, fmt.Sprintf("controller silent since %s (%s ago)", ctl.LastReport.Format(time.RFC3339), now.Sub(ctl.LastReport).Round(time.Second)))
		}
		if ctl.CloudMapError != "" {
			c.Stuck = append(c.Stuck, ctl.Registry()+" unreachable: "+ctl.CloudMapError)
		}
		for _, p := range ctl.PeersDown {
			c.Stuck = append(c.Stuck, "peer unreachable: "+p)
		}
		for _, name := range slices.Sorted(maps.Keys(ctl.Proofs)) {
			if p := ctl.Proofs[name]; p.Drained {
				c.Stuck = append(c.Stuck, fmt.Sprintf("cluster %s drained: no proof of life since %s (%s ago); its endpoints are not routed to (docs/traffic.md#a-silent-cluster)",
					name, p.Last.Format(time.RFC3339), now.Sub(p.Last).Round(time.Second)))
			}
		}
	}
	for _, se := range r.Exports {
		c.Exports = append(c.Exports, Export{Namespace: se.Namespace, Name: se.Name,
			Valid:    cond(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionValid)),
			Ready:    cond(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionReady)),
			Conflict: cond(se.Status.Conditions, string(mcsv1beta1.ServiceExportConditionConflict))})
		c.Failing = append(c.Failing, failing("ServiceExport", se.Namespace, se.Name, se.Status.Conditions,
			string(mcsv1beta1.ServiceExportConditionValid), string(mcsv1beta1.ServiceExportConditionReady))...)
		if se.DeletionTimestamp != nil && len(se.Finalizers) > 0 && now.Sub(se.DeletionTimestamp.Time) > StuckAfter {
			c.Stuck = append(c.Stuck, fmt.Sprintf("ServiceExport %s/%s: deletion waiting on finalizers %s for %s", se.Namespace, se.Name,
				strings.Join(se.Finalizers, ","), now.Sub(se.DeletionTimestamp.Time).Round(time.Second)))
		}
	}
	ready := readyByImport(r.Slices)
	for _, si := range r.Imports {
		imp := Import{Namespace: si.Namespace, Name: si.Name, Type: string(si.Spec.Type), IPs: si.Spec.IPs, Clusters: []string{},
			Ready: ready[si.Namespace+"/"+si.Name]}
		if imp.Ready == nil {
			imp.Ready = map[string]int{}
		}
		for _, cl := range si.Status.Clusters {
			imp.Clusters = append(imp.Clusters, cl.Cluster)
		}
		c.Imports = append(c.Imports, imp)
		c.Failing = append(c.Failing, failing("ServiceImport", si.Namespace, si.Name, si.Status.Conditions, string(mcsv1beta1.ServiceImportConditionReady))...)
		for _, t := range []string{imports.ConditionRemovalHeld, imports.ConditionEndpointsCapped} {
			if rc := meta.FindStatusCondition(si.Status.Conditions, t); rc != nil && rc.Status == metav1.ConditionTrue {
				c.Failing = append(c.Failing, fmt.Sprintf("ServiceImport %s/%s: %s: %s", si.Namespace, si.Name, t, rc.Message))
			}
		}
	}
	for _, svc := range r.Services {
		if rc := meta.FindStatusCondition(svc.Status.Conditions, cloudmapdns.ConditionRegistered); rc != nil && rc.Reason == cloudmapdns.ReasonDomainConflict {
			c.Stuck = append(c.Stuck, fmt.Sprintf("Service %s/%s: DomainConflict: %s", svc.Namespace, svc.Name, rc.Message))
		}
		if svc.DeletionTimestamp != nil && len(svc.Finalizers) > 0 && now.Sub(svc.DeletionTimestamp.Time) > StuckAfter {
			c.Stuck = append(c.Stuck, fmt.Sprintf("Service %s/%s: deletion waiting on finalizers %s", svc.Namespace, svc.Name, strings.Join(svc.Finalizers, ",")))
		}
	}
	sort.Slice(c.Exports, func(i, j int) bool {
		return c.Exports[i].Namespace+"/"+c.Exports[i].Name < c.Exports[j].Namespace+"/"+c.Exports[j].Name
	})
	sort.Slice(c.Imports, func(i, j int) bool {
		return c.Imports[i].Namespace+"/"+c.Imports[i].Name < c.Imports[j].Namespace+"/"+c.Imports[j].Name
	})
	return c
}

// noController says what is missing when no status Lease was found.
func noController(r Read) string {
	switch {
	case len(r.LeasesElsewhere) > 1:
		var where []string
		for _, l := range r.LeasesElsewhere {
			where = append(where, l.Namespace)
		}
		return fmt.Sprintf("no controller status in namespace %s; controllers report in namespaces %s: pass --status-namespace with one of them",
			r.StatusNamespace, strings.Join(where, ", "))
	case r.StatusNamespaceMissing:
		return fmt.Sprintf("no controller status: namespace %s does not exist and no namespace holds a %s Lease: no controller has reported to this cluster "+
			"(install one, or start `clustermap controller --kubeconfig ...`, which creates the namespace)", r.StatusNamespace, statuslease.LeaseName)
	}
	return fmt.Sprintf("no controller status: no %s Lease in namespace %s: the controller is not running, or cannot write its status Lease (see its log)",
		statuslease.LeaseName, r.StatusNamespace)
}

// failing says which of an object's conditions of types are False, and why.
func failing(kind, ns, name string, cs []metav1.Condition, types ...string) []string {
	var out []string
	for _, t := range types {
		if rc := meta.FindStatusCondition(cs, t); rc != nil && rc.Status == metav1.ConditionFalse {
			out = append(out, fmt.Sprintf("%s %s/%s: %s False/%s: %s", kind, ns, name, t, rc.Reason, rc.Message))
		}
	}
	return out
}

func cond(cs []metav1.Condition, t string) string {
	if c := meta.FindStatusCondition(cs, t); c != nil {
		return string(c.Status) + "/" + c.Reason
	}
	return "-"
}

func controllerOf(l *coordinationv1.Lease) *Controller {
	a := l.Annotations
	ctl := &Controller{Namespace: l.Namespace, Version: a[statuslease.AnnotationVersion], CloudMapError: a[statuslease.AnnotationCloudMapErr],
		RecordFormat: a[statuslease.AnnotationRecordFormat], Instances: a[statuslease.AnnotationInstances]}
	if l.Spec.HolderIdentity != nil {
		ctl.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime != nil {
		ctl.LastReport = l.Spec.RenewTime.Time
	}
	if m := a[statuslease.AnnotationModes]; m != "" {
		ctl.Modes = strings.Split(m, ",")
	}
	if p := a[statuslease.AnnotationPeersDown]; p != "" {
		ctl.PeersDown = strings.Split(p, ",")
	}
	if t, err := time.Parse(time.RFC3339, a[statuslease.AnnotationLastSync]); err == nil {
		ctl.LastCloudMap = &t
	}
	if v := a[statuslease.AnnotationSources]; v != "" {
		_ = json.Unmarshal([]byte(v), &ctl.Sources) // a report from a newer release may differ: shown without
	}
	if v := a[statuslease.AnnotationProofs]; v != "" {
		_ = json.Unmarshal([]byte(v), &ctl.Proofs)
	}
	return ctl
}

func heartbeat(l *coordinationv1.Lease) time.Duration {
	var s int
	if _, err := fmt.Sscan(l.Annotations[statuslease.AnnotationHeartbeatSec], &s); err != nil || s <= 0 {
		return statuslease.Heartbeat
	}
	return time.Duration(s) * time.Second
}

// readyByImport counts ready endpoints of clustermap's EndpointSlices by
// import and address family.
func readyByImport(slices []discoveryv1.EndpointSlice) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, s := range slices {
		key := s.Namespace + "/" + s.Labels[mcsv1beta1.LabelServiceName]
		if out[key] == nil {
			out[key] = map[string]int{}
		}
		for _, e := range s.Endpoints {
			if kube.EndpointReady(e.Conditions) {
				out[key][string(s.AddressType)] += len(e.Addresses)
			}
		}
	}
	return out
}

// families prints ready endpoints per family: "IPv4:3 IPv6:3".
func families(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for _, f := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", f, m[f]))
	}
	return strings.Join(parts, " ")
}

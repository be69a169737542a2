package clusterstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/statuslease"
)

// Gather reads what the report needs from one cluster; statusNamespace
// holds the controller's status Lease.
func Gather(ctx context.Context, c client.Reader, kubeContext, statusNamespace string) (Read, error) {
	r := Read{Context: kubeContext}
	for name, dst := range map[string]*string{aboutv1alpha1.ClusterIDProperty: &r.ClusterID, aboutv1alpha1.ClusterSetProperty: &r.ClusterSet} {
		cp := &aboutv1alpha1.ClusterProperty{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, cp); err == nil {
			*dst = cp.Spec.Value
		} else if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return r, err
		}
	}
	r.StatusNamespace = statusNamespace
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: statusNamespace, Name: statuslease.LeaseName}, lease); err == nil {
		r.Lease = lease
	} else if !apierrors.IsNotFound(err) {
		return r, err
	} else if err := leaseElsewhere(ctx, c, &r); err != nil {
		return r, err
	}
	exports := &mcsv1beta1.ServiceExportList{}
	if err := c.List(ctx, exports); err != nil && !meta.IsNoMatchError(err) {
		return r, err
	}
	r.Exports = exports.Items
	imps := &mcsv1beta1.ServiceImportList{}
	if err := c.List(ctx, imps); err != nil && !meta.IsNoMatchError(err) {
		return r, err
	}
	r.Imports = imps.Items
	sl := &discoveryv1.EndpointSliceList{}
	if err := c.List(ctx, sl, client.MatchingLabels{discoveryv1.LabelManagedBy: imports.ManagedBy}); err != nil {
		return r, err
	}
	r.Slices = sl.Items
	svcs := &corev1.ServiceList{}
	if err := c.List(ctx, svcs); err != nil {
		return r, err
	}
	for _, s := range svcs.Items {
		if meta.FindStatusCondition(s.Status.Conditions, cloudmapdns.ConditionRegistered) != nil || controllerutil.ContainsFinalizer(&s, cloudmapdns.Finalizer) {
			r.Services = append(r.Services, s)
		}
	}
	return r, nil
}

// leaseElsewhere looks for the status Lease in every namespace (a
// controller given another --status-namespace) and, without one, says
// whether the expected namespace exists at all. A user who may not list
// Leases everywhere gets the plain answer.
func leaseElsewhere(ctx context.Context, c client.Reader, r *Read) error {
	leases := &coordinationv1.LeaseList{}
	err := c.List(ctx, leases, client.MatchingFields{"metadata.name": statuslease.LeaseName})
	if err != nil && !apierrors.IsForbidden(err) {
		return err
	}
	r.LeasesElsewhere = leases.Items
	if len(leases.Items) == 1 {
		r.Lease = &leases.Items[0]
		return nil
	}
	err = c.Get(ctx, client.ObjectKey{Name: r.StatusNamespace}, &corev1.Namespace{})
	r.StatusNamespaceMissing = apierrors.IsNotFound(err)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		return err
	}
	return nil
}

// JSON writes the report as JSON.
func JSON(w io.Writer, clusters []Cluster) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"clusters": clusters})
}

// Table writes the report for people: per cluster, its controller, exports,
// imports and what is stuck.
func Table(w io.Writer, clusters []Cluster) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for i, c := range clusters {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "CLUSTER %s (context %s, clusterset %s)\n", orDash(c.ClusterID), c.Context, orDash(c.ClusterSet))
		if c.Error != "" {
			fmt.Fprintf(tw, "  unreachable: %s\n", c.Error)
			continue
		}
		if ctl := c.Controller; ctl != nil {
			sync := "never"
			if ctl.LastCloudMap != nil {
				sync = ctl.LastCloudMap.Format("2006-01-02T15:04:05Z07:00")
			}
			fmt.Fprintf(tw, "  controller %s (%s, modes %s, status in namespace %s), last report %s, last sync of %s %s\n",
				ctl.Holder, orDash(ctl.Version), orDash(strings.Join(ctl.Modes, ",")), ctl.Namespace, ctl.LastReport.Format("2006-01-02T15:04:05Z07:00"), ctl.Registry(), sync)
			for _, name := range slices.Sorted(maps.Keys(ctl.Sources)) {
				s := ctl.Sources[name]
				sync := "never"
				if s.LastSync != nil {
					sync = s.LastSync.Format("2006-01-02T15:04:05Z07:00")
				}
				if s.Error != "" {
					sync += ", failing: " + s.Error
				}
				if name == statuslease.HubSource {
					fmt.Fprintf(tw, "  hub registry: last sync %s\n", sync)
					continue
				}
				fmt.Fprintf(tw, "  Cloud Map %s (Region/account): last sync %s\n", name, sync)
			}
			if ctl.RecordFormat != "" {
				fmt.Fprintf(tw, "  endpoint records %s\n", ctl.RecordFormat)
			}
			if ctl.Instances != "" {
				fmt.Fprintf(tw, "  Cloud Map instances (quota headroom) %s\n", ctl.Instances)
			}
			for _, name := range slices.Sorted(maps.Keys(ctl.Proofs)) {
				p := ctl.Proofs[name]
				state := "alive"
				if p.Drained {
					state = "DRAINED"
				}
				fmt.Fprintf(tw, "  cluster %s: last proof of life %s, %s\n", name, p.Last.Format("2006-01-02T15:04:05Z07:00"), state)
			}
		}
		for _, n := range c.Notes {
			fmt.Fprintf(tw, "  note: %s\n", n)
		}
		fmt.Fprintln(tw, "  EXPORT\tVALID\tREADY\tCONFLICT")
		for _, e := range c.Exports {
			fmt.Fprintf(tw, "  %s/%s\t%s\t%s\t%s\n", e.Namespace, e.Name, e.Valid, e.Ready, e.Conflict)
		}
		fmt.Fprintln(tw, "  IMPORT\tTYPE\tIPS\tCLUSTERS\tREADY ENDPOINTS")
		for _, im := range c.Imports {
			fmt.Fprintf(tw, "  %s/%s\t%s\t%s\t%s\t%s\n", im.Namespace, im.Name, im.Type, orDash(strings.Join(im.IPs, ",")), orDash(strings.Join(im.Clusters, ",")), families(im.Ready))
		}
		if len(c.Stuck) == 0 {
			fmt.Fprintln(tw, "  nothing stuck")
		}
		for _, s := range c.Stuck {
			fmt.Fprintf(tw, "  STUCK: %s\n", s)
		}
		if len(c.Failing) == 0 {
			fmt.Fprintln(tw, "  nothing failing")
		}
		for _, s := range c.Failing {
			fmt.Fprintf(tw, "  FAILING: %s\n", s)
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

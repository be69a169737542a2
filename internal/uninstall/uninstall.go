// Package uninstall takes clustermap out of clusters without leaving
// anything behind and without touching what users own: first the running
// controllers withdraw what they published (Withdraw), then, with the
// controllers stopped (Stop), what they made in each cluster goes
// (Cleanup). ServiceExports and annotated Services stay; nothing is left
// holding a clustermap finalizer, so the CRDs can go after.
package uninstall

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmapdns"
	"github.com/clustermap/clustermap/internal/export"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/replication"
	"github.com/clustermap/clustermap/internal/statuslease"
	"github.com/clustermap/clustermap/internal/withdraw"
)

// Cluster is one cluster to take clustermap out of.
type Cluster struct {
	Name   string
	Client client.Client
}

// ControllerLabel selects the controller's pods and Deployment (chart and
// kustomize alike).
const ControllerLabel = controllerLabelKey + "=" + controllerLabelValue

const controllerLabelKey, controllerLabelValue = "app.kubernetes.io/name", "clustermap-controller"

// Withdraw asks the running controller to withdraw everything it
// published, touching nothing users own: it creates the Lease
// withdraw.LeaseName in the controller's namespace, on which the
// controller takes every export's records out of Cloud Map and every
// Cloud Map DNS registration back, and removes its finalizers. The
// ServiceExports and the annotated Services stay as they are. It waits
// until no clustermap finalizer is left, or returns what is still holding
// one.
func Withdraw(ctx context.Context, c Cluster, namespace string, timeout time.Duration, out io.Writer) error {
	req := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: withdraw.LeaseName,
		Labels: map[string]string{statuslease.ManagedByLabel: statuslease.ManagedBy}}}
	if err := c.Client.Create(ctx, req); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%s: asking the controller to withdraw (Lease %s/%s): %w", c.Name, namespace, withdraw.LeaseName, err)
	}
	fmt.Fprintf(out, "%s: the controller is asked to withdraw what it published (Lease %s/%s); ServiceExports and annotated Services stay\n", c.Name, namespace, withdraw.LeaseName)
	var left []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		left, err = finalized(ctx, c.Client)
		return len(left) == 0, err
	})
	if err != nil && len(left) > 0 {
		return fmt.Errorf("%s: still waiting for the controller to withdraw %s (is it running? it must be, to take records out of Cloud Map; --force drops the finalizers and leaves the records)",
			c.Name, strings.Join(left, ", "))
	}
	if err == nil {
		fmt.Fprintf(out, "%s: every export and Cloud Map DNS registration withdrawn\n", c.Name)
	}
	return err
}

// finalized lists the objects still holding a clustermap finalizer.
func finalized(ctx context.Context, cl client.Client) ([]string, error) {
	var left []string
	exports := &mcsv1beta1.ServiceExportList{}
	if err := cl.List(ctx, exports); err != nil && !meta.IsNoMatchError(err) {
		return nil, err
	}
	for i := range exports.Items {
		if controllerutil.ContainsFinalizer(&exports.Items[i], export.Finalizer) {
			left = append(left, "ServiceExport "+exports.Items[i].Namespace+"/"+exports.Items[i].Name)
		}
	}
	svcs := &corev1.ServiceList{}
	if err := cl.List(ctx, svcs); err != nil {
		return nil, err
	}
	for i := range svcs.Items {
		if controllerutil.ContainsFinalizer(&svcs.Items[i], cloudmapdns.Finalizer) {
			left = append(left, "Service "+svcs.Items[i].Namespace+"/"+svcs.Items[i].Name)
		}
	}
	return left, nil
}

// Stop scales the controller's Deployments in namespace to zero and waits
// for their pods to go, so that nothing recreates what Cleanup deletes. It
// says so when it finds none (a controller run another way must be stopped
// by whoever runs it).
func Stop(ctx context.Context, c Cluster, namespace string, timeout time.Duration, out io.Writer) error {
	sel := client.MatchingLabels{controllerLabelKey: controllerLabelValue}
	deps := &appsv1.DeploymentList{}
	if err := c.Client.List(ctx, deps, client.InNamespace(namespace), sel); err != nil {
		return err
	}
	if len(deps.Items) == 0 {
		fmt.Fprintf(out, "%s: no controller Deployment in %s; make sure no clustermap controller runs for this cluster\n", c.Name, namespace)
		return nil
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		base := d.DeepCopy()
		d.Spec.Replicas = ptr.To[int32](0)
		if err := c.Client.Patch(ctx, d, client.MergeFrom(base)); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: Deployment %s/%s scaled to 0\n", c.Name, d.Namespace, d.Name)
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		err := c.Client.List(ctx, pods, client.InNamespace(namespace), sel)
		return err == nil && len(pods.Items) == 0, err
	})
}

// Cleanup deletes, with the controllers stopped, what clustermap made in a
// cluster: imports (ServiceImports, derived Services, EndpointSlices),
// replicas from peers and their EndpointSlices, and the status Lease. With
// force, finalizers a controller did not remove are dropped (their Cloud
// Map records stay). It returns how many objects it deleted.
func Cleanup(ctx context.Context, c Cluster, statusNamespace string, force bool, out io.Writer) (int, error) {
	left, err := finalized(ctx, c.Client)
	if err != nil {
		return 0, err
	}
	if len(left) > 0 && !force {
		return 0, fmt.Errorf("%s: %s still hold clustermap finalizers: withdraw first (the controller running), or --force", c.Name, strings.Join(left, ", "))
	}
	if force {
		if err := dropFinalizers(ctx, c, out); err != nil {
			return 0, err
		}
	}
	n := 0
	del := func(o client.Object, what string) error {
		if err := c.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("%s: deleting %s %s/%s: %w", c.Name, what, o.GetNamespace(), o.GetName(), err)
		}
		n++
		return nil
	}
	sis := &mcsv1beta1.ServiceImportList{}
	if err := c.Client.List(ctx, sis); err != nil && !meta.IsNoMatchError(err) {
		return n, err
	}
	for i := range sis.Items {
		if sis.Items[i].Labels[imports.LabelManagedBy] == "clustermap" {
			if err := del(&sis.Items[i], "ServiceImport"); err != nil {
				return n, err
			}
		}
	}
	svcs := &corev1.ServiceList{}
	if err := c.Client.List(ctx, svcs); err != nil {
		return n, err
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		derived := s.Labels[imports.LabelDerivedFor] != "" && s.Labels[imports.LabelManagedBy] == "clustermap"
		if derived || s.Labels[replication.LabelSourceCluster] != "" {
			if err := del(s, "Service"); err != nil {
				return n, err
			}
		}
	}
	for _, manager := range []string{imports.ManagedBy, replication.ManagedBy} {
		sl := &discoveryv1.EndpointSliceList{}
		if err := c.Client.List(ctx, sl, client.MatchingLabels{discoveryv1.LabelManagedBy: manager}); err != nil {
			return n, err
		}
		for i := range sl.Items {
			if err := del(&sl.Items[i], "EndpointSlice"); err != nil {
				return n, err
			}
		}
	}
	// The status Lease, and the withdrawal request: a later install
	// publishes again.
	for _, name := range []string{statuslease.LeaseName, withdraw.LeaseName} {
		lease := &coordinationv1.Lease{}
		lease.Namespace, lease.Name = statusNamespace, name
		if err := c.Client.Delete(ctx, lease); err == nil {
			n++
		} else if !apierrors.IsNotFound(err) {
			return n, err
		}
	}
	fmt.Fprintf(out, "%s: %d objects clustermap made deleted\n", c.Name, n)
	return n, nil
}

func dropFinalizers(ctx context.Context, c Cluster, out io.Writer) error {
	exports := &mcsv1beta1.ServiceExportList{}
	if err := c.Client.List(ctx, exports); err != nil && !meta.IsNoMatchError(err) {
		return err
	}
	for i := range exports.Items {
		if !controllerutil.ContainsFinalizer(&exports.Items[i], export.Finalizer) {
			continue
		}
		if err := drop(ctx, c.Client, &exports.Items[i], export.Finalizer); err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: ServiceExport %s/%s: finalizer dropped; its Cloud Map records stay\n", c.Name, exports.Items[i].Namespace, exports.Items[i].Name)
	}
	svcs := &corev1.ServiceList{}
	if err := c.Client.List(ctx, svcs); err != nil {
		return err
	}
	for i := range svcs.Items {
		if controllerutil.ContainsFinalizer(&svcs.Items[i], cloudmapdns.Finalizer) {
			if err := drop(ctx, c.Client, &svcs.Items[i], cloudmapdns.Finalizer); err != nil {
				return err
			}
			fmt.Fprintf(out, "%s: Service %s/%s: finalizer dropped; its Cloud Map instances stay\n", c.Name, svcs.Items[i].Namespace, svcs.Items[i].Name)
		}
	}
	return nil
}

func drop(ctx context.Context, cl client.Client, o client.Object, f string) error {
	base := o.DeepCopyObject().(client.Object)
	controllerutil.RemoveFinalizer(o, f)
	return client.IgnoreNotFound(cl.Patch(ctx, o, client.MergeFrom(base)))
}

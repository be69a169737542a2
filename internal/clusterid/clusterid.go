// Package clusterid reads this cluster's identity from its two
// ClusterProperties (KEP-2149).
package clusterid

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
)

// Identity is a cluster's id and the clusterset it belongs to.
type Identity struct {
	ClusterID, ClusterSet string
}

// Validate checks both values: the cluster id appears in DNS names, so it
// must be a DNS label; the clusterset id is written into Cloud Map
// attributes, so it must be non-empty and free of spaces.
func Validate(id Identity) error {
	if errs := validation.IsDNS1123Label(id.ClusterID); len(errs) > 0 {
		return fmt.Errorf("ClusterProperty %s value %q is not a valid DNS label (%s): set it to a lowercase name such as cluster-1",
			aboutv1alpha1.ClusterIDProperty, id.ClusterID, strings.Join(errs, "; "))
	}
	if id.ClusterSet == "" || strings.ContainsAny(id.ClusterSet, " \t\n") || len(id.ClusterSet) > 253 {
		return fmt.Errorf("ClusterProperty %s value %q is not a valid clusterset id: set it to a name without spaces",
			aboutv1alpha1.ClusterSetProperty, id.ClusterSet)
	}
	return nil
}

// Read reads and validates the identity. Its errors name the ClusterProperty
// to create or fix.
func Read(ctx context.Context, c client.Reader) (Identity, error) {
	var id Identity
	for name, into := range map[string]*string{aboutv1alpha1.ClusterIDProperty: &id.ClusterID, aboutv1alpha1.ClusterSetProperty: &id.ClusterSet} {
		cp := &aboutv1alpha1.ClusterProperty{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, cp)
		if apierrors.IsNotFound(err) {
			return id, fmt.Errorf("ClusterProperty %s is missing: create it (kubectl apply a ClusterProperty named %s with spec.value set)", name, name)
		}
		if err != nil {
			return id, fmt.Errorf("reading ClusterProperty %s: %w", name, err)
		}
		*into = cp.Spec.Value
	}
	return id, Validate(id)
}

// Name is how this cluster names itself where no clusterset identity is
// needed (Cloud Map DNS instances): flag when set, else the
// cluster.clusterset.k8s.io ClusterProperty, else kube-system's UID.
func Name(ctx context.Context, c client.Reader, flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	cp := &aboutv1alpha1.ClusterProperty{}
	if err := c.Get(ctx, client.ObjectKey{Name: aboutv1alpha1.ClusterIDProperty}, cp); err == nil && cp.Spec.Value != "" {
		return cp.Spec.Value, nil
	}
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: "kube-system"}, ns); err != nil {
		return "", fmt.Errorf("naming this cluster: pass --cluster-name (reading kube-system: %w)", err)
	}
	return string(ns.UID), nil
}

// Package v1alpha1 holds the about.k8s.io/v1alpha1 ClusterProperty type
// (KEP-2149). sigs.k8s.io/about-api is not on the module proxy, so this small
// type lives here; its schema follows the upstream CRD.
// +kubebuilder:object:generate=true
// +groupName=about.k8s.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of ClusterProperty.
	GroupVersion = schema.GroupVersion{Group: "about.k8s.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

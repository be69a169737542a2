// Package v1alpha1 holds the hub.clustermap.io/v1alpha1 ClusterExport type:
// one member cluster's export of one Service, as a hub cluster's API
// server holds it when the clusterset's registry is a Kubernetes hub
// rather than Cloud Map. Members install nothing of it; `clustermap hub
// init` installs it on the hub.
// +kubebuilder:object:generate=true
// +groupName=hub.clustermap.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of ClusterExport.
	GroupVersion = schema.GroupVersion{Group: "hub.clustermap.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

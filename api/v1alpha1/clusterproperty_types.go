package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Well-known ClusterProperty names (KEP-2149).
const (
	// ClusterIDProperty names this cluster within its clusterset.
	ClusterIDProperty = "cluster.clusterset.k8s.io"
	// ClusterSetProperty names the clusterset this cluster belongs to.
	ClusterSetProperty = "clusterset.k8s.io"
)

// ClusterPropertySpec holds the value of a property.
type ClusterPropertySpec struct {
	// Value is the property's value.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128000
	Value string `json:"value"`
}

// ClusterProperty is a name/value pair describing the cluster it lives in,
// such as its id within a clusterset.
// +kubebuilder:object:root=true
// about.k8s.io is a protected group: the apiserver wants the approving KEP named.
// +kubebuilder:metadata:annotations="api-approved.kubernetes.io=https://github.com/kubernetes/enhancements/tree/master/keps/sig-multicluster/2149-clusterid"
// +kubebuilder:resource:scope=Cluster,shortName=clusterprop
// +kubebuilder:printcolumn:name="Value",type=string,JSONPath=`.spec.value`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterProperty struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ClusterPropertySpec `json:"spec"`
}

// ClusterPropertyList is a list of ClusterProperty.
// +kubebuilder:object:root=true
type ClusterPropertyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterProperty `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ClusterProperty{}, &ClusterPropertyList{})
}

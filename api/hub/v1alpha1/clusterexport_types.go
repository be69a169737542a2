package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"
)

// MaxChunkEndpoints is how many endpoints one ClusterExport holds: about
// 400 KB of JSON at the longest, well under etcd's 1.5 MB request limit.
// A larger export is several objects (chunks).
const MaxChunkEndpoints = 1000

// MaxChunks bounds the chunks of one export: 20,000 endpoints, the
// importers' default cap per cluster and Service.
const MaxChunks = 20

// ClusterLabel, ServiceNamespaceLabel and ServiceNameLabel are set on every
// ClusterExport (they repeat its spec) so that a member lists its own.
const (
	ClusterLabel          = "hub.clustermap.io/cluster"
	ServiceNamespaceLabel = "hub.clustermap.io/service-namespace"
	ServiceNameLabel      = "hub.clustermap.io/service-name"
)

// ClusterExportSpec is one chunk of one cluster's export of one Service.
// Chunk 0 (the head) holds the Service's fields, how many chunks the
// export has and the revision of each other chunk; every chunk holds up
// to MaxChunkEndpoints endpoints. A reader takes an export whole only
// when every chunk carries the revision its head names, so a reader never
// sees half of a write, and a change rewrites only the chunks it changes
// and the head.
// +kubebuilder:validation:XValidation:rule="self.chunk == 0 || (!has(self.ports) && !has(self.labels) && !has(self.annotations) && !has(self.chunkRevisions))",message="only chunk 0 holds the Service's fields"
// +kubebuilder:validation:XValidation:rule="self.chunk < self.chunks",message="chunk must be below chunks"
type ClusterExportSpec struct {
	// Cluster is the exporting cluster's id (a DNS label).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Cluster string `json:"cluster"`
	// Service is the exported Service.
	Service ServiceRef `json:"service"`
	// Chunk is this object's place in the export, from 0 (the head).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=19
	Chunk int32 `json:"chunk"`
	// Chunks is how many objects the export is.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	Chunks int32 `json:"chunks"`
	// Revision is a digest of what this chunk holds; on the head, of the
	// whole export.
	// +kubebuilder:validation:MaxLength=64
	Revision string `json:"revision"`
	// ChunkRevisions, on the head, are the revisions of chunks 1 and on,
	// in order.
	// +optional
	// +kubebuilder:validation:MaxItems=19
	// +kubebuilder:validation:items:MaxLength=64
	ChunkRevisions []string `json:"chunkRevisions,omitempty"`
	// Created is the ServiceExport's creation time (the oldest export wins
	// conflicts).
	// +optional
	Created *metav1.MicroTime `json:"created,omitempty"`
	// Type is the export's ServiceImport type.
	// +optional
	Type mcsv1beta1.ServiceImportType `json:"type,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Ports []mcsv1beta1.ServicePort `json:"ports,omitempty"`
	// +optional
	SessionAffinity corev1.ServiceAffinity `json:"sessionAffinity,omitempty"`
	// +optional
	SessionAffinityConfig *corev1.SessionAffinityConfig `json:"sessionAffinityConfig,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=2
	IPFamilies []corev1.IPFamily `json:"ipFamilies,omitempty"`
	// +optional
	InternalTrafficPolicy *corev1.ServiceInternalTrafficPolicy `json:"internalTrafficPolicy,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=63
	TrafficDistribution *string `json:"trafficDistribution,omitempty"`
	// Labels and Annotations are the exported Service's that an import
	// carries.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Annotations map[string]string `json:"annotations,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=1000
	Endpoints []Endpoint `json:"endpoints,omitempty"`
}

// ServiceRef names a Service by namespace sameness.
type ServiceRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
}

// Endpoint is one address and port of the export.
type Endpoint struct {
	// +kubebuilder:validation:MaxLength=45
	IP string `json:"ip"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
	// +optional
	// +kubebuilder:validation:MaxLength=63
	PortName string `json:"portName,omitempty"`
	// +optional
	Protocol corev1.Protocol `json:"protocol,omitempty"`
	// +optional
	Ready bool `json:"ready,omitempty"`
	// +optional
	Serving bool `json:"serving,omitempty"`
	// +optional
	Terminating bool `json:"terminating,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Hostname string `json:"hostname,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Zone string `json:"zone,omitempty"`
	// ServicePort is the service port this endpoint port serves.
	ServicePort mcsv1beta1.ServicePort `json:"servicePort"`
	// +optional
	// +kubebuilder:validation:MaxLength=63
	TargetPort string `json:"targetPort,omitempty"`
}

// ClusterExport is one chunk of one member cluster's export of one
// Service, in the hub's namespace of its clusterset. Its name is
// <namespace>.<name>.<cluster>.<chunk>; the hub's admission policy holds a
// member to that (so no member holds a name another's record needs) and
// to its own cluster's records.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=cx
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.cluster`
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.service.namespace`
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.spec.service.name`
// +kubebuilder:printcolumn:name="Chunk",type=integer,JSONPath=`.spec.chunk`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ClusterExport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ClusterExportSpec `json:"spec"`
}

// ClusterExportList is a list of ClusterExport.
// +kubebuilder:object:root=true
type ClusterExportList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterExport `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ClusterExport{}, &ClusterExportList{})
}

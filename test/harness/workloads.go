//go:build linux

package harness

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/clustermap/clustermap/internal/locality"
)

// App is a Deployment of Replicas pods labelled app=Name and a Service of
// the same name selecting them.
type App struct {
	Namespace, Name string
	Replicas        int32
	Headless        bool
	// Ports of the Service (default: http 80 -> 8080); the pods declare
	// each target port.
	Ports          []corev1.ServicePort
	PodAnnotations map[string]string
	// Shape, when set, adjusts the Service before it is created.
	Shape func(*corev1.Service)
}

// HTTP is the default port: http 80 -> 8080.
var HTTP = corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}

// Objects are the Deployment and the Service.
func (a App) Objects() (*appsv1.Deployment, *corev1.Service) {
	ports := a.Ports
	if len(ports) == 0 {
		ports = []corev1.ServicePort{HTTP}
	}
	labels := map[string]string{"app": a.Name}
	var cports []corev1.ContainerPort
	for _, p := range ports {
		cports = append(cports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.TargetPort.IntVal, Protocol: p.Protocol})
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: a.Name, Namespace: a.Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(a.Replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: a.PodAnnotations},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app", Ports: cports}}}},
		},
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: a.Name, Namespace: a.Namespace}, Spec: corev1.ServiceSpec{Selector: labels, Ports: ports}}
	if a.Headless {
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	}
	if a.Shape != nil {
		a.Shape(svc)
	}
	return dep, svc
}

// CreateApp creates the app's Deployment and Service, and returns the
// Service as the API server made it.
func CreateApp(t testing.TB, cl client.Client, a App) *corev1.Service {
	t.Helper()
	dep, svc := a.Objects()
	Must(t, cl.Create(context.Background(), dep))
	Must(t, cl.Create(context.Background(), svc))
	return svc
}

// PlaceNodes labels every node of the cluster with a zone name and a zone
// id, as EKS labels its nodes: zone names map to different zones in
// different accounts, zone ids do not.
func PlaceNodes(t testing.TB, cl client.Client, zone, zoneID string) {
	t.Helper()
	var nodes corev1.NodeList
	Must(t, cl.List(context.Background(), &nodes))
	for _, n := range nodes.Items {
		// A patch, not an update: the node's heartbeat may have changed it
		// since the list, and an update would then fail on the conflict.
		patch := client.MergeFrom(n.DeepCopy())
		n.Labels[locality.LabelZone] = zone
		n.Labels[locality.LabelZoneID] = zoneID
		Must(t, cl.Patch(context.Background(), &n, patch))
	}
}

// Scale sets the replicas of a Deployment. The Deployment controller
// writes it too: a conflict is retried.
func Scale(t testing.TB, cl client.Client, ns, name string, n int32) {
	t.Helper()
	// A merge patch of the replicas alone: an update raced the deployment
	// controller's status writes past RetryOnConflict's five tries in a
	// clean-clone run.
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)))
	Must(t, cl.Patch(context.Background(), dep, patch))
}

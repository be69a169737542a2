//go:build e2e

package bench

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func runtimeCores() int { return runtime.NumCPU() }

// createApp makes a Deployment of replicas pods labelled app=name and a
// Service selecting them on port 80 -> 8080; shape adjusts the Service.
func createApp(ctx context.Context, b *testing.B, cl client.Client, ns, name string, replicas int32, shape func(*corev1.Service)) {
	createAppWith(ctx, b, cl, ns, name, replicas, nil, shape)
}

// createAppWith is createApp with annotations on the pods.
func createAppWith(ctx context.Context, b *testing.B, cl client.Client, ns, name string, replicas int32, podAnnotations map[string]string, shape func(*corev1.Service)) {
	labels := map[string]string{"app": name}
	if err := cl.Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: podAnnotations}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "c", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}}}},
	}}); err != nil {
		b.Fatal(err)
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
	}}
	if shape != nil {
		shape(svc)
	}
	if err := cl.Create(ctx, svc); err != nil {
		b.Fatal(err)
	}
}

// callsBetween sums the emulator's calls between two readings of
// emulatorCalls, and lists them by operation.
func callsBetween(before, after map[string]float64) (total float64, byOp string) {
	var ops []string
	for op, v := range after {
		if d := v - before[op]; d > 0 {
			total += d
			ops = append(ops, fmt.Sprintf("%s %.0f", op, d))
		}
	}
	sort.Strings(ops)
	return total, strings.Join(ops, ", ")
}

// addPod scales a Deployment up by one and waits for the new pod's address
// in the source cluster's EndpointSlices; it returns the address and when
// it appeared there.
func addPod(ctx context.Context, b *testing.B, cl client.Client, source *importTracker, ns, name string) (string, time.Time) {
	old := source.ips(ns + "/" + name)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dep := &appsv1.Deployment{}
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, dep); err != nil {
			return err
		}
		dep.Spec.Replicas = ptr.To(*dep.Spec.Replicas + 1)
		return cl.Update(ctx, dep)
	}); err != nil {
		b.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		for a := range source.ips(ns + "/" + name) {
			if !old[a] {
				return a, time.Now()
			}
		}
		if time.Since(start) > time.Minute {
			b.Fatalf("no new pod address for %s/%s", ns, name)
		}
	}
}

//go:build linux

package devenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	aboutv1alpha1 "github.com/clustermap/clustermap/api/v1alpha1"
	"github.com/clustermap/clustermap/config/crd"
	"github.com/clustermap/clustermap/internal/registry/hub"
)

// Scheme knows the types devenv writes.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(Scheme))
	utilruntime.Must(aboutv1alpha1.AddToScheme(Scheme))
}

const readyTimeout = 2 * time.Minute

// prepare makes a fresh cluster usable: apiserver ready, CRDs established,
// ClusterProperties set, simulated nodes Ready, default ServiceAccount there.
func prepare(ctx context.Context, c *Cluster, opts Options) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, "apiserver /readyz", 100*time.Millisecond, func(ctx context.Context) (bool, error) {
		if err := componentsAlive(kwokClusterDir(opts.StateDir, c.KwokName)); err != nil {
			return false, permanent{err}
		}
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil, err
	}); err != nil {
		return err
	}
	cl, err := client.New(c.Config, client.Options{Scheme: Scheme})
	if err != nil {
		return err
	}
	if err := InstallCRDs(ctx, cl); err != nil {
		return err
	}
	if c.Hub {
		return hub.Init(ctx, c.Config, opts.ClusterSet)
	}
	props := map[string]string{
		aboutv1alpha1.ClusterIDProperty:  c.ID,
		aboutv1alpha1.ClusterSetProperty: opts.ClusterSet,
	}
	for name, value := range props {
		cp := &aboutv1alpha1.ClusterProperty{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: aboutv1alpha1.ClusterPropertySpec{Value: value}}
		if err := cl.Create(ctx, cp); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	for i := 1; i <= opts.Nodes; i++ {
		if err := cl.Create(ctx, fakeNode(fmt.Sprintf("%s-node-%d", c.ID, i), c.NodePodCIDRs(i))); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	if err := waitFor(ctx, "nodes Ready", 100*time.Millisecond, func(ctx context.Context) (bool, error) {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		ready, states := 0, []string{}
		for _, n := range nodes.Items {
			state := "no Ready condition"
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					state = "Ready=" + string(cond.Status)
					if cond.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			states = append(states, n.Name+" "+state)
		}
		if ready < opts.Nodes {
			if err := componentsAlive(kwokClusterDir(opts.StateDir, c.KwokName)); err != nil {
				return false, permanent{err}
			}
			// Said when the wait ends without them: what kwok made of them.
			return false, fmt.Errorf("%d of %d nodes Ready: %s", ready, opts.Nodes, strings.Join(states, ", "))
		}
		return true, nil
	}); err != nil {
		log := filepath.Join(kwokClusterDir(opts.StateDir, c.KwokName), "logs", "kwok-controller.log")
		out, _ := os.ReadFile(log)
		return fmt.Errorf("%w; the end of %s:\n%s", err, log, tail(out, 15))
	}
	// Pods cannot be created before the ServiceAccount controller made the
	// namespace's default account.
	return waitFor(ctx, "default ServiceAccount", 100*time.Millisecond, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, client.IgnoreNotFound(err)
	})
}

// fakeNode is a node kwok simulates (it manages nodes with this
// annotation), with its own pod ranges: the IPAM assigns from them.
func fakeNode(name string, podCIDRs []string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
		},
		Spec: corev1.NodeSpec{PodCIDR: podCIDRs[0], PodCIDRs: podCIDRs},
	}
}

// InstallCRDs creates the CRDs of config/crd and waits until they are served.
func InstallCRDs(ctx context.Context, cl client.Client) error {
	files, err := fs.Glob(crd.Files, "bases/*.yaml")
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := crd.Files.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, obj); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := cl.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating CRD %s: %w", obj.Name, err)
		}
		if err := waitFor(ctx, "CRD "+obj.Name+" established", 50*time.Millisecond, func(ctx context.Context) (bool, error) {
			got := &apiextensionsv1.CustomResourceDefinition{}
			if err := cl.Get(ctx, client.ObjectKey{Name: obj.Name}, got); err != nil {
				return false, err
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// componentsAlive fails, with the end of its log, on the first component of
// the cluster whose process has exited: waiting for it would only time out.
func componentsAlive(dir string) error {
	files, _ := filepath.Glob(filepath.Join(dir, "pids", "*.pid"))
	for _, f := range files {
		if pidAlive(f) {
			continue
		}
		// kwokctl may be restarting the component: look again before
		// calling it dead.
		time.Sleep(300 * time.Millisecond)
		if pidAlive(f) {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		log := filepath.Join(dir, "logs", name+".log")
		out, _ := os.ReadFile(log)
		return fmt.Errorf("%w: %s exited; the end of %s:\n%s", errComponentExited, name, log, tail(out, 15))
	}
	return nil
}

var errComponentExited = errors.New("a component of the cluster stopped")

// pidAlive tells whether a pid file names a running process; a missing
// file is a component not started yet.
func pidAlive(f string) bool {
	if _, err := os.Stat(f); os.IsNotExist(err) {
		return true
	}
	pids := readPidFile(f)
	return len(pids) == 1 && Alive(pids[0])
}

package dataplane

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

// ServiceAccountDir is where a pod's containers find their service
// account's token, the cluster's CA and their namespace: client-go's
// in-cluster configuration reads them there.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// tokenLifetime: the lab's pods live for a test or a demo; a kubelet
// would renew the token at 80% of it.
const tokenLifetime = 24 * 60 * 60

// apiserver is how a node's pods reach their cluster's apiserver: the
// host's fabric address (the apiserver's certificate holds it), at the
// apiserver's port, with the CA that signed it.
type apiserver struct {
	port string
	ca   []byte
}

func apiserverOf(nodeKubeconfig string) (apiserver, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", nodeKubeconfig)
	if err != nil {
		return apiserver{}, err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return apiserver{}, err
	}
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		if ca, err = os.ReadFile(cfg.CAFile); err != nil {
			return apiserver{}, err
		}
	}
	return apiserver{port: u.Port(), ca: ca}, nil
}

// env is what a kubelet puts in every container for the apiserver,
// first, so a container's own entries win. The host address is of a
// family the pod has.
func (s apiserver) env(f Fabric, ips []netip.Addr) []string {
	host := f.HostAddrs()[0]
	if len(ips) > 0 && !ips[0].Is4() {
		host = f.HostAddrs()[1]
	}
	return []string{"KUBERNETES_SERVICE_HOST=" + host.String(), "KUBERNETES_SERVICE_PORT=" + s.port,
		"KUBERNETES_PORT=tcp://" + net.JoinHostPort(host.String(), s.port)}
}

// credentials writes, under dir, what a pod's containers see at
// ServiceAccountDir: a token of the pod's service account bound to the
// pod (the TokenRequest API, as a kubelet's projected volume), the CA and
// the namespace. It returns "" for a pod that opts out of the token.
func (a *agent) credentials(ctx context.Context, p *corev1.Pod, dir string) (string, error) {
	if t := p.Spec.AutomountServiceAccountToken; t != nil && !*t {
		return "", nil
	}
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	exp := int64(tokenLifetime)
	tr, err := a.cs.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &exp,
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token of service account %s/%s: %w", p.Namespace, sa, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": a.api.ca, "namespace": []byte(p.Namespace)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// inPod runs argv in a pod's network namespace and, when the pod has
// credentials, with them mounted at ServiceAccountDir: self's pod-exec
// mounts them in the mount namespace `ip netns exec` makes for argv alone.
func inPod(ns, self, credentials string, argv []string) []string {
	if credentials == "" {
		return inNS(ns, argv)
	}
	return inNS(ns, append([]string{self, "pod-exec", "--serviceaccount", credentials, "--"}, argv...))
}

// MountAndExec, in a mount namespace of its own (as `ip netns exec`
// leaves it), mounts credentials read-only at ServiceAccountDir and
// replaces itself with argv.
func MountAndExec(credentials string, argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("no command")
	}
	// The mount point is made in the host's file system (empty, /run);
	// what is mounted on it stays in this namespace.
	if err := os.MkdirAll(ServiceAccountDir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(credentials, ServiceAccountDir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mounting %s at %s: %w", credentials, ServiceAccountDir, err)
	}
	if err := unix.Mount("", ServiceAccountDir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("making %s read-only: %w", ServiceAccountDir, err)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	return unix.Exec(path, argv, os.Environ())
}

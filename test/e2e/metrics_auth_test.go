//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/test/harness"
)

// metricsReader is the ServiceAccount the chart's values bind to its
// metrics-reader ClusterRole in these tests (metricsReaders).
const metricsReader = "metrics-reader"

// saToken is a TokenRequest token of a ServiceAccount, made if missing.
func saToken(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	harness.Must(t, err)
	return tok.Status.Token
}

// checkSecureMetrics scrapes https://addr/metrics as Prometheus would
// (self-signed certificate, a ServiceAccount's token): no token is 401, a
// ServiceAccount the chart does not bind is 403, the bound reader gets the
// component's metrics.
func checkSecureMetrics(t *testing.T, cs kubernetes.Interface, addr, component string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	scrape := func(token string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), nil
	}
	reader, stranger := saToken(t, cs, releaseNS, metricsReader), saToken(t, cs, releaseNS, "stranger")
	for _, c := range []struct {
		who, token string
		want       int
	}{{"no token", "", http.StatusUnauthorized}, {"an unbound ServiceAccount", stranger, http.StatusForbidden}, {"the bound reader", reader, http.StatusOK}} {
		harness.Eventually(t, 30*time.Second, fmt.Sprintf("%s /metrics for %s", component, c.who), func() error {
			code, body, err := scrape(c.token)
			if err != nil {
				return err
			}
			if code != c.want {
				return fmt.Errorf("HTTP %d, want %d: %.200s", code, c.want, body)
			}
			if code == http.StatusOK && !strings.Contains(body, `clustermap_build_info{component="`+component+`"`) {
				return fmt.Errorf("the metrics lack clustermap_build_info for %s", component)
			}
			return nil
		})
	}
	// Plain HTTP gets nothing from a TLS port.
	if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "clustermap_") {
			t.Errorf("%s /metrics answers over plain HTTP", component)
		}
	}
}

// The DNS server run as the chart's DNS ServiceAccount (its ClusterRole
// grants the reviews /metrics needs), metrics served as the chart runs it.
func TestDNSMetricsSecure(t *testing.T) {
	inParallel(t)
	env := harness.Clusters(t, 1)
	c := env.Clusters[0]
	ctx := context.Background()
	cl := harness.Client(t, c.Config)
	ch := loadChart(t)
	namespace(t, cl, releaseNS)
	harness.Must(t, applyAll(ctx, cl, crds(t, ch)))
	v := modeValues(false, false, false, true)
	delete(v, "serviceMonitor")
	v["metricsReaders"] = []any{map[string]any{"name": metricsReader, "namespace": releaseNS}}
	objs, err := render(ch, v)
	harness.Must(t, err)
	harness.Must(t, applyAll(ctx, cl, objs))
	cs := kubernetes.NewForConfigOrDie(c.Config)
	kubeconfig := tokenKubeconfig(t, c.Config, saToken(t, cs, releaseNS, release+"-dns"))

	metrics := harness.FreeAddr(t)
	cmd := exec.Command(filepath.Join(devenv.BinDir(), "clustermap"), "dns", "--kubeconfig", kubeconfig,
		"--listen", harness.FreeAddr(t), "--health-address", harness.FreeAddr(t), "--metrics-bind-address", metrics, "--metrics-secure")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	harness.Must(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("clustermap dns:\n%s", out.String())
		}
	})
	checkSecureMetrics(t, cs, metrics, "dns")
}

// tokenKubeconfig writes a kubeconfig that authenticates with a bearer
// token only, as a pod's in-cluster configuration does.
func tokenKubeconfig(t *testing.T, cfg *rest.Config, token string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile, InsecureSkipTLSVerify: cfg.Insecure}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	harness.Must(t, clientcmd.WriteToFile(*kc, path))
	harness.Must(t, os.Chmod(path, 0o600))
	return path
}

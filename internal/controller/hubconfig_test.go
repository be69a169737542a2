package controller

import (
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// A hub kubeconfig that does not stand on its own (plain HTTP, TLS not
// verified, a CA read from a file) is refused, naming what; one as
// clustermap hub join writes it is taken.
func TestHubConfigRefusesInsecure(t *testing.T) {
	write := func(c *clientcmdapi.Cluster) string {
		kc := clientcmdapi.NewConfig()
		kc.Clusters["hub"] = c
		kc.AuthInfos["m"] = &clientcmdapi.AuthInfo{Token: "t"}
		kc.Contexts["hub"] = &clientcmdapi.Context{Cluster: "hub", AuthInfo: "m", Namespace: "clusterset-x"}
		kc.CurrentContext = "hub"
		path := filepath.Join(t.TempDir(), "kubeconfig")
		if err := clientcmd.WriteToFile(*kc, path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for what, c := range map[string]*clientcmdapi.Cluster{
		"is not https://":          {Server: "http://hub:6443"},
		"insecure-skip-tls-verify": {Server: "https://hub:6443", InsecureSkipTLSVerify: true},
		"reads the file":           {Server: "https://hub:6443", CertificateAuthority: "/etc/ca.crt"},
	} {
		if _, err := hubConfig(write(c)); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("%s: %v", what, err)
		}
	}
	cfg, err := hubConfig(write(&clientcmdapi.Cluster{Server: "https://hub:6443", CertificateAuthorityData: []byte("ca")}))
	if err != nil || cfg.Host != "https://hub:6443" || cfg.BearerToken != "t" {
		t.Errorf("a kubeconfig as hub join writes it: %v %v", cfg, err)
	}
	if _, err := hubConfig(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "hub join writes it") {
		t.Errorf("a missing file: %v", err)
	}
}

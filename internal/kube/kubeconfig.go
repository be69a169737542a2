package kube

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"

	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// KubeconfigProblems names what makes a kubeconfig that another cluster's
// controller runs with (a peer's, a hub's) unsafe to hand over: a server
// that is not https://, TLS not verified, a proxy, or a file read from the
// machine it runs on. Empty: it stands on its own.
func KubeconfigProblems(raw *clientcmdapi.Config) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(raw.Clusters)) {
		c := raw.Clusters[name]
		if u, err := url.Parse(c.Server); err != nil || u.Scheme != "https" {
			problems = append(problems, fmt.Sprintf("cluster %s: server %q is not https://", name, c.Server))
		}
		if c.InsecureSkipTLSVerify {
			problems = append(problems, fmt.Sprintf("cluster %s: insecure-skip-tls-verify", name))
		}
		if c.CertificateAuthority != "" {
			problems = append(problems, fmt.Sprintf("cluster %s: certificate-authority reads the file %s", name, c.CertificateAuthority))
		}
		if c.ProxyURL != "" {
			problems = append(problems, fmt.Sprintf("cluster %s: proxy-url %s", name, c.ProxyURL))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(raw.AuthInfos)) {
		a := raw.AuthInfos[name]
		for what, file := range map[string]string{"tokenFile": a.TokenFile, "client-certificate": a.ClientCertificate, "client-key": a.ClientKey} {
			if file != "" {
				problems = append(problems, fmt.Sprintf("user %s: %s reads the file %s", name, what, file))
			}
		}
	}
	slices.Sort(problems)
	return problems
}

// CAData is the certificate authority cfg verifies its server with, inline
// (read from its file where it names one): what a kubeconfig handed to
// another cluster must carry.
func CAData(cfg *rest.Config) ([]byte, error) {
	if len(cfg.CAData) > 0 || cfg.CAFile == "" {
		return cfg.CAData, nil
	}
	return os.ReadFile(cfg.CAFile)
}

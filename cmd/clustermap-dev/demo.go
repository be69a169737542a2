//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/miekg/dns"
	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
	"github.com/clustermap/clustermap/internal/devenv"
	"github.com/clustermap/clustermap/internal/devenv/dataplane"
	cmdns "github.com/clustermap/clustermap/internal/dns"
	"github.com/clustermap/clustermap/internal/imports"
	"github.com/clustermap/clustermap/internal/kube"
)

const demoNamespace, demoService = "default", "nginx"

// runDemo starts two clusters, the Cloud Map emulator and a controller per
// cluster, exports a sample service from cluster-1 and shows it as
// cluster-2 imports it; then it runs until interrupted.
func runDemo(ctx context.Context, cmd *cobra.Command, opts devenv.Options, cloudMapAddr string) error {
	w := cmd.OutOrStdout()
	opts.Clusters = 2
	cm, err := devenv.StartCloudMap(cloudmaplocal.Options{}, cloudMapAddr, "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("%w (choose another address with --cloudmap-listen)", err)
	}
	defer cm.Close()
	env, err := devenv.Up(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(cmd.ErrOrStderr(), "demo: stopping")
		if err := env.Down(context.Background()); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "demo: stopping failed, run `clustermap-dev down`:", err)
		}
	}()

	// A controller per cluster, logging to a file each.
	ctrlCtx, stopControllers := context.WithCancel(ctx)
	var logs []string
	wait := env.StartControllers(ctrlCtx, cm.URL, func(c *devenv.Cluster) logr.Logger {
		path := filepath.Join(env.StateDir, "controller-"+c.ID+".log")
		f, err := os.Create(path)
		if err != nil {
			return logr.Discard()
		}
		logs = append(logs, path)
		return zap.New(zap.WriteTo(f))
	}, nil)
	defer func() {
		stopControllers()
		if err := wait(); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "demo: controller:", err)
		}
	}()

	src, err := client.New(env.Clusters[0].Config, client.Options{Scheme: kube.Scheme()})
	if err != nil {
		return err
	}
	dst, err := client.New(env.Clusters[1].Config, client.Options{Scheme: kube.Scheme()})
	if err != nil {
		return err
	}
	if err := deploySample(ctx, src, opts.Dataplane); err != nil {
		return err
	}
	start := time.Now()
	fmt.Fprintf(w, "\nExported Service %s/%s (3 nginx pods) from cluster-1. Waiting for cluster-2 to import it...\n", demoNamespace, demoService)
	si, slices, err := waitImport(ctx, dst, 3)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "cluster-2 imported it after %v:\n\n", time.Since(start).Round(time.Millisecond))
	printImport(w, si, slices)

	// A clusterset.local DNS server per cluster, as CoreDNS would forward to.
	var dnsAddrs []string
	for _, c := range env.Clusters {
		srv, err := cmdns.Start(ctx, c.Config, "127.0.0.1:0", "clusterset.local", 5, nil)
		if err != nil {
			return err
		}
		defer srv.Close()
		<-srv.Synced()
		host, port, _ := net.SplitHostPort(srv.Addr)
		dnsAddrs = append(dnsAddrs, fmt.Sprintf("  dig -p %s @%s %s.%s.svc.clusterset.local    # %s's", port, host, demoService, demoNamespace, c.ID))
		if c.ID == "cluster-2" {
			if err := printLookup(w, srv.Addr, demoService+"."+demoNamespace+".svc.clusterset.local."); err != nil {
				return err
			}
		}
	}

	if opts.Dataplane {
		if err := demoRequest(ctx, w, dst, env); err != nil {
			return err
		}
	}

	printUsage(cmd, env)
	fmt.Fprintf(w, `
Explore:
  kubectl --context cluster-2 get serviceimports,services,endpointslices -n %[1]s
  kubectl --context cluster-1 get serviceexport %[2]s -n %[1]s -o yaml     # Valid, Ready, Conflict conditions
  kubectl --context cluster-1 scale deployment %[2]s -n %[1]s --replicas 5  # and watch cluster-2's EndpointSlices follow
Cloud Map emulator: %[3]s (faults and metrics: %[4]s/faults, %[4]s/metrics)
  AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local aws --region us-east-1 --endpoint-url %[3]s servicediscovery list-namespaces
  AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_DISABLE_HOST_PREFIX_INJECTION=true aws --region us-east-1 --endpoint-url %[3]s servicediscovery discover-instances --namespace-name %[1]s --service-name %[2]s
(the AWS CLI sends DiscoverInstances to data-<host> unless AWS_DISABLE_HOST_PREFIX_INJECTION is set, which aws-cli 1.45 knows and Debian 12's 2.9 does not)
clusterset.local DNS servers beside the demo (UDP and TCP):
%[6]s
Controller logs: %[5]s
%[7]s
The demo runs until interrupted (Ctrl-C), then stops everything.
`, demoNamespace, demoService, cm.URL, cm.AdminURL, strings.Join(logs, ", "), strings.Join(dnsAddrs, "\n"), requestHint(opts.Dataplane))
	<-ctx.Done()
	return nil
}

// deployment is a sample Deployment; with a data plane its pods get their
// own network and a server answering on their ports.
func deployment(name string, replicas int32, dataplaneOn bool, ports ...corev1.ContainerPort) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	tmpl := metav1.ObjectMeta{Labels: labels}
	if dataplaneOn {
		tmpl.Annotations = map[string]string{dataplane.Annotation: "true"}
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: demoNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: tmpl, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: name, Image: name, Ports: ports}}}},
		},
	}
}

func deploySample(ctx context.Context, cl client.Client, dataplaneOn bool) error {
	labels := map[string]string{"app": demoService}
	objs := []client.Object{
		deployment(demoService, 3, dataplaneOn, corev1.ContainerPort{ContainerPort: 80}),
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: demoService, Namespace: demoNamespace},
			Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(80)}}},
		},
		&mcsv1beta1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Name: demoService, Namespace: demoNamespace}},
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil {
			return fmt.Errorf("creating the sample %T: %w", o, err)
		}
	}
	return nil
}

// waitImport waits for the sample's import with n ready endpoints.
func waitImport(ctx context.Context, cl client.Client, n int) (*mcsv1beta1.ServiceImport, []discoveryv1.EndpointSlice, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		si := &mcsv1beta1.ServiceImport{}
		slices := &discoveryv1.EndpointSliceList{}
		if cl.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: demoService}, si) == nil && len(si.Spec.IPs) > 0 &&
			cl.List(ctx, slices, client.InNamespace(demoNamespace), client.MatchingLabels{mcsv1beta1.LabelServiceName: demoService, discoveryv1.LabelManagedBy: imports.ManagedBy}) == nil {
			ready := 0
			for _, s := range slices.Items {
				ready += len(s.Endpoints)
			}
			if ready == n {
				return si, slices.Items, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("cluster-2 did not import %s/%s within a minute: see the controller logs", demoNamespace, demoService)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func printImport(w io.Writer, si *mcsv1beta1.ServiceImport, slices []discoveryv1.EndpointSlice) {
	var clusters, ports []string
	for _, c := range si.Status.Clusters {
		clusters = append(clusters, c.Cluster)
	}
	for _, p := range si.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s %d/%s", p.Name, p.Port, p.Protocol))
	}
	fmt.Fprintf(w, "  ServiceImport %s/%s: type %s, clusterset IP %s, ports %s, from clusters %s\n",
		si.Namespace, si.Name, si.Spec.Type, strings.Join(si.Spec.IPs, ","), strings.Join(ports, ", "), strings.Join(clusters, ","))
	for _, s := range slices {
		var addrs []string
		for _, e := range s.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
		fmt.Fprintf(w, "  EndpointSlice %s (source %s, for Service %s): %s port %d\n",
			s.Name, s.Labels[mcsv1beta1.LabelSourceCluster], s.Labels[discoveryv1.LabelServiceName], strings.Join(addrs, ", "), *s.Ports[0].Port)
	}
}

// printLookup shows a DNS answer the way nslookup does.
func printLookup(w io.Writer, server, name string) error {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(m, server)
	if err != nil {
		return fmt.Errorf("asking cluster-2's DNS server for %s: %w", name, err)
	}
	host, port, _ := net.SplitHostPort(server)
	fmt.Fprintf(w, "\n$ nslookup -port=%s %s %s   # cluster-2's clusterset DNS\nServer:\t%s\n\n", port, strings.TrimSuffix(name, "."), host, server)
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			fmt.Fprintf(w, "Name:\t%s\nAddress: %s\n", strings.TrimSuffix(name, "."), a.A)
		}
	}
	return nil
}

// clientPod is a plain client pod: a sleep loop, into which requests go
// with kubectl exec.
func clientPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client", Namespace: demoNamespace, Annotations: map[string]string{dataplane.Annotation: "true"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "client", Image: "busybox",
			Command: []string{"sh", "-c", "while true; do sleep 3600; done"}}}},
	}
}

// demoRequest starts a client pod in cluster-2 and, from inside it (the
// exec API kubectl exec uses), asks the sample by its clusterset name
// until a pod of cluster-1 answers: cluster-2's DNS, kube-proxy and the
// routes between the clusters at work.
func demoRequest(ctx context.Context, w io.Writer, dst client.Client, env *devenv.Env) error {
	if err := dst.Create(ctx, clientPod()); err != nil {
		return fmt.Errorf("creating the client pod: %w", err)
	}
	url := demoService + "." + demoNamespace + ".svc.clusterset.local"
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last string
	for {
		out, errOut, err := devenv.PodExec(ctx, env.Clusters[1], devenv.SPDY, demoNamespace, "client", "", nil, "curl", "-sS", "--max-time", "2", url)
		if err == nil {
			fmt.Fprintf(w, "\n$ kubectl --context cluster-2 exec client -- curl -s %s\n%s\n", url, strings.TrimSpace(out))
			return nil
		}
		last = strings.TrimSpace(errOut + " " + err.Error())
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer to curl %s from cluster-2 within a minute (last: %s): see kube-proxy.log, coredns.log and dns.log under %s", url, last, env.StateDir)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// requestHint shows how to send the demo's requests again, with kubectl.
func requestHint(dataplaneOn bool) string {
	if !dataplaneOn {
		return ""
	}
	return fmt.Sprintf(`Requests from a pod of cluster-2 (its DNS, kube-proxy, the routes between the clusters):
  kubectl --context cluster-2 exec client -- curl -s %[1]s.%[2]s.svc.clusterset.local
  kubectl --context cluster-2 exec client -- nslookup %[1]s.%[2]s.svc.clusterset.local
  kubectl --context cluster-2 exec client -- dig +short %[1]s.%[2]s.svc.clusterset.local
`, demoService, demoNamespace)
}

//go:build linux

package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/clustermap/clustermap/internal/devenv"
)

// Kubectl runs the pinned kubectl (bin/kubectl) against a cluster of env,
// as a user does: kubectl --kubeconfig <env's> --context <cluster> args...
func Kubectl(ctx context.Context, env *devenv.Env, c *devenv.Cluster, stdin io.Reader, args ...string) (stdout, stderr string, err error) {
	cmd := exec.CommandContext(ctx, filepath.Join(env.BinDir, "kubectl"), append([]string{"--kubeconfig", env.Kubeconfig, "--context", c.ID}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// Exec runs a command in a pod's first container with kubectl exec and
// returns its output; a failure carries stderr.
func Exec(ctx context.Context, env *devenv.Env, c *devenv.Cluster, ns, pod string, argv ...string) (string, error) {
	out, errOut, err := Kubectl(ctx, env, c, nil, append([]string{"exec", "-n", ns, pod, "--"}, argv...)...)
	if err != nil {
		return out, fmt.Errorf("kubectl exec %s/%s -- %s: %v: %s", ns, pod, strings.Join(argv, " "), err, strings.TrimSpace(errOut))
	}
	return out, nil
}

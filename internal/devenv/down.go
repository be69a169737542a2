//go:build linux

// Tearing an environment down: every cluster stopped, its processes
// gone, its files removed.

package devenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/clustermap/clustermap/internal/devenv/dataplane"
)

// Down stops every cluster of the environment in stateDir and removes its
// files. Stopping nothing is not an error.
func Down(ctx context.Context, stateDir string, log io.Writer) error {
	if log == nil {
		log = io.Discard
	}
	var st state
	data, err := os.ReadFile(filepath.Join(stateDir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(log, "devenv: nothing runs from %s\n", stateDir)
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(stateDir, stateFile), err)
	}
	// Every cluster kwokctl knows in this workdir goes, listed or not: a
	// crashed Up may have left one the state does not name yet.
	entries, _ := os.ReadDir(filepath.Join(kwokWorkdir(stateDir), "clusters"))
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if err := stopCluster(ctx, st.BinDir, stateDir, e.Name(), log); err != nil {
			errs = append(errs, err)
		}
	}
	// The data plane goes whether Up recorded it or died before: its
	// names derive from the state directory.
	if abs, err := filepath.Abs(stateDir); err == nil {
		errs = append(errs, dataplane.Teardown(ctx, dataplane.TagOf(abs)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if st.Kubeconfig != "" && !strings.HasPrefix(st.Kubeconfig, stateDir+string(filepath.Separator)) {
		if err := os.Remove(st.Kubeconfig); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.RemoveAll(stateDir)
}

// Pids lists the processes of the environment's clusters.
func (e *Env) Pids() []int {
	var all []int
	for _, c := range e.withHub() {
		all = append(all, readPids(filepath.Join(kwokClusterDir(e.StateDir, c.KwokName), "pids"))...)
	}
	return all
}

// Down stops the environment.
func (e *Env) Down(ctx context.Context) error {
	for _, c := range e.Clusters {
		letGo(kwokClusterDir(e.StateDir, c.KwokName))
	}
	return Down(ctx, e.StateDir, e.Log)
}

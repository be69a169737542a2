//go:build linux

// Small helpers of the lifecycle: waiting for a condition, a command
// output's tail, the state file.

package devenv

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func tail(out []byte, lines int) string {
	l := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// permanent marks an error that no amount of waiting will cure.
type permanent struct{ error }

// waitFor polls cond every interval until it holds, fails permanently, or ctx ends.
func waitFor(ctx context.Context, what string, interval time.Duration, cond func(context.Context) (bool, error)) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, interval, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if p, isPermanent := err.(permanent); isPermanent {
			return false, p.error
		}
		if err != nil {
			last = err
		}
		return ok, nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() == nil:
		return err // permanent
	case last != nil:
		return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
	default:
		return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	}
}

//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/clustermap/clustermap/internal/devenv"
)

// terminalSession: `exec -t` gets a real terminal in the pod: client-go's
// executor with TTY (as test suites run it, with and without stdin, over
// each protocol) and kubectl exec -it driven through a terminal, with the
// window size, its changes and the exit code.
func (d *dpWorld) terminalSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, proto := range []string{devenv.WebSocket, devenv.SPDY} {
		// No stdin, no size: as the upstream conformance suite execs. The
		// terminal is the command's, stderr comes through it.
		var out bytes.Buffer
		err := devenv.PodTerminal(ctx, d.at, proto, d.ns, d.client, "client", nil, &out, nil,
			"sh", "-c", "tty; stty size; cat /etc/resolv.conf; echo to-stderr >&2; exit 4")
		var code utilexec.ExitError
		if !errors.As(err, &code) || code.ExitStatus() != 4 {
			t.Errorf("terminal exec over %s: %v, want exit 4", proto, err)
		}
		for _, want := range []string{"/dev/pts/", "24 80", "search dp.svc.cluster.local", "to-stderr"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("terminal exec over %s: output lacks %q:\n%s", proto, want, out.String())
			}
		}

		// Stdin and a window that changes: each line typed prints the size
		// the terminal has then; ^D ends the loop.
		sizes := &sizeQueue{ch: make(chan remotecommand.TerminalSize, 4)}
		sizes.ch <- remotecommand.TerminalSize{Width: 101, Height: 33}
		in, typed := io.Pipe()
		term := &watched{}
		done := make(chan error, 1)
		go func() {
			done <- devenv.PodTerminal(ctx, d.at, proto, d.ns, d.client, "client", in, term, sizes,
				"sh", "-c", "stty size; while read line; do stty size; done; exit 9")
		}()
		// Each size is awaited with a line typed now and then: the first
		// may land just after the command started (it is sent as the
		// session opens, and a loaded node may start the command first).
		newline := func() { _, _ = io.WriteString(typed, "\n") }
		term.waitFor(t, "33 101", newline)
		sizes.ch <- remotecommand.TerminalSize{Width: 132, Height: 50}
		term.waitFor(t, "50 132", newline)
		_, _ = io.WriteString(typed, "\x04") // ^D: end of input, on a terminal
		err = <-done
		_ = typed.Close()
		if !errors.As(err, &code) || code.ExitStatus() != 9 {
			t.Errorf("interactive terminal exec over %s: %v, want exit 9; output:\n%s", proto, err, term.String())
		}
	}

	// kubectl exec -it POD -- sh, typed at a terminal of 30x90 that grows.
	cmd := exec.CommandContext(ctx, filepath.Join(d.env.BinDir, "kubectl"), "--kubeconfig", d.env.Kubeconfig, "--context", d.at.ID,
		"exec", "-it", "-n", d.ns, d.client, "--", "sh")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 90})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	term := &watched{}
	go func() { _, _ = io.Copy(term, ptmx) }()
	_, _ = io.WriteString(ptmx, "echo $((6*7))\r")
	term.waitFor(t, "42", nil)
	size := func() { _, _ = io.WriteString(ptmx, "stty size\r") }
	term.waitFor(t, "30 90", size)
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	term.waitFor(t, "40 120", size)
	_, _ = io.WriteString(ptmx, "exit 5\r")
	err = cmd.Wait()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 5 {
		t.Errorf("kubectl exec -it ... -- sh, then exit 5: %v, want exit code 5; terminal:\n%s", err, term.String())
	}
}

// sizeQueue hands client-go the window sizes a test sends.
type sizeQueue struct {
	ch chan remotecommand.TerminalSize
}

func (q *sizeQueue) Next() *remotecommand.TerminalSize {
	s, ok := <-q.ch
	if !ok {
		return nil
	}
	return &s
}

// watched is a terminal's output as it comes.
type watched struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *watched) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *watched) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitFor waits until the output holds want, doing poke (when set) every
// half second meanwhile.
func (w *watched) waitFor(t *testing.T, want string, poke func()) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(w.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the terminal never showed %q:\n%s", want, w.String())
		}
		if poke != nil {
			poke()
		}
		time.Sleep(500 * time.Millisecond)
	}
}

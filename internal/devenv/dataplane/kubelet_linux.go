package dataplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"

	"github.com/creack/pty"
	"k8s.io/apimachinery/pkg/types"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/util/cert"
	streaming "k8s.io/kubelet/pkg/cri/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// Target is where a container's commands run: its pod's network
// namespace (with the pod's resolv.conf), its environment and working
// directory, and the file its output goes to.
type Target struct {
	NetNS string
	Env   []string
	Dir   string
	Log   string
	// Programs: host programs for the image's (ProcessOf).
	Programs map[string]string
	// Credentials are the pod's service account files ("" without),
	// mounted by Self (inPod).
	Self, Credentials string
}

// Kubelet answers the part of the kubelet API the apiserver proxies
// `kubectl exec` and `kubectl logs` to, for the pods of one node
// namespace. Only the host (where the apiservers run) may call it.
type Kubelet struct {
	// Find names a container's target, or an error saying why it has none.
	Find func(namespace, pod, container string) (Target, error)
	// Allowed are the addresses callers may come from: the host's.
	Allowed []netip.Addr

	listener net.Listener
}

// Listen opens the kubelet port on every address of the calling
// thread's network namespace.
func (k *Kubelet) Listen(port int32) error {
	l, err := net.Listen("tcp", ":"+strconv.Itoa(int(port)))
	k.listener = l
	return err
}

// Serve answers on the port Listen opened (TLS, a certificate made here:
// the apiserver of a dev cluster does not check kubelets' certificates)
// until ctx ends.
func (k *Kubelet) Serve(ctx context.Context) error {
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/exec/{namespace}/{pod}/{container}", k.exec)
	mux.HandleFunc("/containerLogs/{namespace}/{pod}/{container}", k.logs)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Handler: k.onlyHost(mux), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ServeTLS(k.listener, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (k *Kubelet) onlyHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !slices.Contains(k.Allowed, ap.Addr().Unmap()) {
			http.Error(w, "only the host's apiserver may call this node", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (k *Kubelet) target(w http.ResponseWriter, r *http.Request) (Target, bool) {
	t, err := k.Find(r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return t, false
	}
	return t, true
}

func (k *Kubelet) exec(w http.ResponseWriter, r *http.Request) {
	t, ok := k.target(w, r)
	if !ok {
		return
	}
	opts, err := streaming.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := r.URL.Query()["command"]
	name := r.PathValue("namespace") + "/" + r.PathValue("pod")
	streaming.ServeExec(w, r, executor{t}, name, "", r.PathValue("container"), cmd, opts,
		4*time.Hour, 30*time.Second, remotecommandconsts.SupportedStreamingProtocols)
}

// executor runs an exec session's command in the container's target.
type executor struct{ t Target }

func (e executor) ExecInContainer(ctx context.Context, _ string, _ types.UID, _ string, argv []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(argv) == 0 {
		return errors.New("no command")
	}
	argv = inPod(e.t.NetNS, e.t.Self, e.t.Credentials, Rewrite(argv, e.t.Programs))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = e.t.Env, e.t.Dir
	// The session ends with its command, whether or not the client still
	// holds stdin open or a child of the command holds stdout.
	cmd.WaitDelay = time.Second
	var err error
	if tty {
		err = runOnTerminal(cmd, in, out, resize)
	} else {
		if in != nil {
			cmd.Stdin = in
		}
		if out != nil {
			cmd.Stdout = out
		}
		if errw != nil {
			cmd.Stderr = errw
		}
		err = cmd.Run()
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && exitErr.Exited() {
		return utilexec.CodeExitError{Err: err, Code: exitErr.ExitCode()}
	}
	return err
}

// firstSizeWait bounds the wait for the window size a client sends as an
// exec session opens.
const firstSizeWait = 250 * time.Millisecond

// runOnTerminal runs cmd as a container runtime runs `exec -t`: in a
// session of its own whose controlling terminal is a new pseudo-terminal,
// sized and resized as the client's window is. What the client types goes
// in; the terminal's output (stderr too, as on any terminal) comes out.
func runOnTerminal(cmd *exec.Cmd, in io.Reader, out io.Writer, resize <-chan remotecommand.TerminalSize) error {
	// The client sends its window size as the session opens: the command
	// starts at it (what it prints first is laid out for it). A client
	// that sends none gets the conventional 80x24 after a short wait.
	first := &pty.Winsize{Rows: 24, Cols: 80}
	select {
	case size, ok := <-resize:
		if ok {
			first = &pty.Winsize{Rows: size.Height, Cols: size.Width}
		}
	case <-time.After(firstSizeWait):
	}
	ptmx, err := pty.StartWithSize(cmd, first)
	if err != nil {
		return err
	}
	defer ptmx.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case size, ok := <-resize:
				if !ok {
					return
				}
				_ = pty.Setsize(ptmx, &pty.Winsize{Rows: size.Height, Cols: size.Width})
			case <-done:
				return
			}
		}
	}()
	if in != nil {
		go func() { _, _ = io.Copy(ptmx, in) }()
	}
	if out == nil {
		out = io.Discard
	}
	copied := make(chan struct{})
	go func() {
		// Ends with EIO once the command and every child holding the
		// terminal are gone, after what they wrote is read.
		_, _ = io.Copy(out, ptmx)
		close(copied)
	}()
	err = cmd.Wait()
	select {
	case <-copied:
	case <-time.After(cmd.WaitDelay):
	}
	return err
}

// logs serves a container's output as `kubectl logs` asks for it: all of
// it or the last tailLines lines, then, with follow, what comes after.
func (k *Kubelet) logs(w http.ResponseWriter, r *http.Request) {
	t, ok := k.target(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	if q.Get("previous") == "true" {
		http.Error(w, "the dev data plane keeps one log per container: leave out --previous", http.StatusBadRequest)
		return
	}
	f, err := os.Open(t.Log)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if n, err := strconv.Atoi(q.Get("tailLines")); err == nil && n >= 0 {
		data = TailLines(data, n)
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write(data)
	if q.Get("follow") != "true" {
		return
	}
	fl, _ := w.(http.Flusher)
	buf := make([]byte, 32*1024)
	for {
		if fl != nil {
			fl.Flush()
		}
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func selfSigned() (tls.Certificate, error) {
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey("clustermap-dev-node", nil, nil)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

package dataplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Identity is what a pod server answers with: who answered, on which port.
type Identity struct {
	Pod, Namespace, Cluster string
}

// Answer is one line naming the pod, its cluster and the port asked.
func (id Identity) Answer(port int, proto string) string {
	return fmt.Sprintf("pod=%s namespace=%s cluster=%s port=%d/%s", id.Pod, id.Namespace, id.Cluster, port, proto)
}

// ParseAnswer reads an answer's fields (pod, namespace, cluster, port).
func ParseAnswer(s string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

// Serve answers HTTP on every TCP port and echoes on every UDP port, both
// families, with the pod's identity, until ctx ends.
func Serve(ctx context.Context, id Identity, tcp, udp []int) error {
	errc := make(chan error, len(tcp)+len(udp))
	for _, port := range tcp {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			return err
		}
		answer := id.Answer(port, "TCP")
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, answer)
		})}
		go func() { errc <- srv.Serve(l) }()
		defer srv.Close()
	}
	for _, port := range udp {
		c, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
		if err != nil {
			return err
		}
		defer c.Close()
		answer := id.Answer(port, "UDP")
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					errc <- err
					return
				}
				_, _ = c.WriteTo([]byte(answer+" echo="+strings.TrimSpace(string(buf[:n]))+"\n"), from)
			}
		}()
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

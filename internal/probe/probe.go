// Package probe is what `clustermap verify` runs inside each cluster: a
// server that answers every TCP connection and UDP datagram with its
// cluster and pod, and a checker that, from a pod, resolves names and
// dials addresses as a plan lists them, reporting what came back.
package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Greeting is the first word of every answer, so that an answer from
// something else on the port is told apart.
const Greeting = "clustermap-probe"

// Answer is one server's reply: "clustermap-probe <cluster> <pod>".
func Answer(cluster, pod string) string {
	return fmt.Sprintf("%s %s %s\n", Greeting, cluster, pod)
}

// ParseAnswer returns the cluster of an answer.
func ParseAnswer(s string) (cluster string, err error) {
	f := strings.Fields(s)
	if len(f) != 3 || f[0] != Greeting {
		return "", fmt.Errorf("not a probe's answer: %q", strings.TrimSpace(s))
	}
	return f[1], nil
}

// Serve answers on TCP and UDP port (every address, both families) until
// ctx ends. A TCP client sends one line first; a datagram gets one back.
func Serve(ctx context.Context, port int, cluster, pod string) error {
	addr := fmt.Sprintf(":%d", port)
	var lc net.ListenConfig
	// UDP first: whoever sees the TCP port listen may send datagrams at
	// once (a clean-clone run's test was refused on UDP in between).
	pc, err := lc.ListenPacket(ctx, "udp", addr)
	if err != nil {
		return err
	}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		pc.Close()
		return err
	}
	answer := []byte(Answer(cluster, pod))
	go func() {
		<-ctx.Done()
		ln.Close()
		pc.Close()
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(answer, from)
		}
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			// The request's line is read first: closing with it unread
			// would reset the connection and could discard the answer.
			_, _ = bufio.NewReader(conn).ReadString('\n')
			_, _ = conn.Write(answer)
		}()
	}
}

// Failure classes: what a failed dial or lookup says about its cause.
const (
	Timeout     = "timeout"     // nothing came back: dropped on the way (route, security group, NACL)
	Refused     = "refused"     // the host said no: nothing listens, or a policy rejects
	Unreachable = "unreachable" // a router said there is no route
	NoAnswer    = "no-answer"   // an answer that is not a probe's
	NXDomain    = "nxdomain"    // the name does not exist
	NoData      = "nodata"      // the name exists, without records of the type
	DNSError    = "dns-error"   // the resolver failed (SERVFAIL, REFUSED, no server)
)

// Classify names the class of a dial error.
func Classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return Unreachable
	case errors.As(err, &ne) && ne.Timeout():
		return Timeout
	}
	return NoAnswer
}

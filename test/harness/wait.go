//go:build linux

package harness

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Eventually polls check every 200 ms until it returns nil, failing the
// test with its last error after within.
func Eventually(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	EventuallyEvery(t, 200*time.Millisecond, within, what, check)
}

// EventuallyEvery is Eventually with its own poll period, for checks that
// cost calls (the fault campaign reads Cloud Map).
func EventuallyEvery(t testing.TB, every, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(every)
	}
}

// Must fails the test on an error.
func Must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// FreeAddr picks a loopback address nobody listens on, for a process
// that must come back on the same one. Never one it picked before: the
// listener is closed at once, so the kernel may hand the same port out
// again, and a process given two (clustermap dns --listen and
// --health-address) failed to bind the second.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		picked.Lock()
		fresh := !picked.addrs[addr]
		picked.addrs[addr] = true
		picked.Unlock()
		if fresh {
			return addr
		}
	}
}

// picked are the addresses FreeAddr handed out.
var picked = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// WaitListening waits until something accepts connections on addr.
func WaitListening(ctx context.Context, addr string) error {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nothing listens on %s: %w", addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

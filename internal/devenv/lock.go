//go:build linux

package devenv

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockCreates serializes cluster creation across every process of the
// machine. kwokctl picks each free port by counting down from 32767 and
// probing, so two concurrent creates pick the same etcd port and the second
// apiserver silently joins the first one's etcd. Holding this lock until a
// cluster's components listen makes the next create see those ports taken.
func lockCreates(ctx context.Context) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "clustermap-devenv.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if err != syscall.EWOULDBLOCK {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

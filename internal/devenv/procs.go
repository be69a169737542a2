//go:build linux

package devenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// readPids reads kwokctl's pid files: kwokctl starts every component in its
// own session, so they outlive whoever started them unless stopped.
func readPids(dir string) []int {
	files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	var pids []int
	for _, f := range files {
		pids = append(pids, readPidFile(f)...)
	}
	return pids
}

func readPidFile(f string) []int {
	data, err := os.ReadFile(f)
	if err != nil {
		return nil
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 {
		return []int{pid}
	}
	return nil
}

// Alive reports whether a process exists and has not exited.
func Alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	// A zombie has exited; only its parent's wait is missing.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// reap makes sure the processes are gone: kwokctl delete asks them to stop,
// whatever still runs after a grace period is killed.
func reap(pids []int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var alive []int
		for _, p := range pids {
			if Alive(p) {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			for _, p := range alive {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			time.Sleep(200 * time.Millisecond)
			var left []string
			for _, p := range alive {
				if Alive(p) {
					left = append(left, strconv.Itoa(p))
				}
			}
			if len(left) > 0 {
				return errors.New("processes survived SIGKILL: " + strings.Join(left, ", "))
			}
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

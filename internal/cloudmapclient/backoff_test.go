package cloudmapclient

import (
	"testing"
	"time"
)

// The operation backoff climbs to 2 s and stays there: an operation that
// takes minutes is polled until it ends, not given up on at the cap.
func TestOperationBackoffKeepsItsCap(t *testing.T) {
	next := operationBackoff.DelayFunc()
	var got []time.Duration
	for range 12 {
		got = append(got, next())
	}
	want := []time.Duration{20, 40, 80, 160, 320, 640, 1280, 2000, 2000, 2000, 2000, 2000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v, want %v ms", got, want)
		}
	}
}

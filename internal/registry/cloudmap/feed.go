package cloudmap

import (
	"context"
)

// feed tells the watcher which services changed: in one account the
// instance operations (operationsFeed), across accounts each cluster's
// change record (recordsFeed).
type feed interface {
	// baseline takes every change so far as read: a listing that reads
	// every service follows. If it or that listing fails (a throttled
	// catch-up), undo (never nil) hands the changes back to the polls:
	// they must not wait for a catch-up that may fail again for minutes.
	baseline(ctx context.Context) (undo func(), err error)
	// poll marks the services changed since the last poll dirty.
	poll(ctx context.Context) error
}

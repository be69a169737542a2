package cloudmap

import (
	"context"
)

// feed tells the watcher which services changed: in one account the
// instance operations (operationsFeed), across accounts each cluster's
// change record (recordsFeed).
type feed interface {
	// baseline takes every change so far as read: a listing that reads
	// every service follows.
	baseline(ctx context.Context) error
	// poll marks the services changed since the last poll dirty.
	poll(ctx context.Context) error
}

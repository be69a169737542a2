package cloudmapclient

import (
	"context"
	"errors"

	"github.com/aws/aws-sdk-go-v2/aws"
	sd "github.com/aws/aws-sdk-go-v2/service/servicediscovery"
	"github.com/aws/aws-sdk-go-v2/service/servicediscovery/types"
)

// Write is one instance write: a registration with its attributes, a
// deregistration without (nil).
type Write struct {
	ID         string
	Attributes map[string]string
}

// Outcome is how one write's call ended, each error Cloud Map names once.
type Outcome struct {
	// Op is the operation Cloud Map started: the write was accepted, and
	// ends later (it may still fail).
	Op string
	// Busy: DuplicateRequest, a write of this instance still runs.
	Busy bool
	// Missing: InstanceNotFound, the instance a deregistration names is
	// not there (already done).
	Missing bool
	// NoService: the service is not there (another writer deleted it).
	NoService bool
	// Full: ResourceLimitExceeded, with Cloud Map's reason.
	Full string
	// Err is the call's error, nil when Op is set.
	Err error
}

// WriteInstances sends every write to a service, FanOut at a time, and
// calls done with each outcome as its call returns, concurrently: the
// caller keeps what it must know of its own operations before a poll can
// list them. It returns done's errors joined. Every instance write of
// every mode goes through here.
func WriteInstances(ctx context.Context, c *sd.Client, serviceID string, writes []Write, done func(i int, o Outcome) error) error {
	return Each(ctx, len(writes), func(ctx context.Context, i int) error {
		return done(i, writeInstance(ctx, c, serviceID, writes[i]))
	})
}

func writeInstance(ctx context.Context, c *sd.Client, serviceID string, w Write) Outcome {
	var op *string
	var err error
	if w.Attributes != nil {
		var out *sd.RegisterInstanceOutput
		if out, err = c.RegisterInstance(ctx, &sd.RegisterInstanceInput{ServiceId: aws.String(serviceID), InstanceId: aws.String(w.ID), Attributes: w.Attributes}); err == nil {
			op = out.OperationId
		}
	} else {
		var out *sd.DeregisterInstanceOutput
		if out, err = c.DeregisterInstance(ctx, &sd.DeregisterInstanceInput{ServiceId: aws.String(serviceID), InstanceId: aws.String(w.ID)}); err == nil {
			op = out.OperationId
		}
	}
	o := Outcome{Op: aws.ToString(op), Err: err}
	var busy *types.DuplicateRequest
	var missing *types.InstanceNotFound
	var full *types.ResourceLimitExceeded
	switch {
	case err == nil:
	case errors.As(err, &busy):
		o.Busy = true
	case errors.As(err, &missing):
		o.Missing = true
	case IsNotFound(err):
		o.NoService = true
	case errors.As(err, &full):
		o.Full = aws.ToString(full.Message)
		if o.Full == "" {
			o.Full = err.Error()
		}
	}
	return o
}

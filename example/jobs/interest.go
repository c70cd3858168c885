// Package jobs is the recipe for a job that runs on one instance at a time: every instance of
// the service ticks, the one that takes the job's lock runs it, and the others skip that tick.
// docs/jobs.md walks through it.
package jobs

import (
	"context"
	"errors"
	"time"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Interest accrues interest every tick, on one instance at a time. It is a go-zero
// service.Service: add it to the service's ServiceGroup beside the servers, and go-zero starts
// it with them and stops it at shutdown.
type Interest struct {
	locker *flightlock.Locker // the Middleware's, in Reject mode: busy means another instance runs the job
	every  time.Duration
	accrue func(ctx context.Context) error
	stop   chan struct{}
	done   chan struct{}
}

// NewInterest builds the job on the Locker of the service's Middleware (so its locks live in
// the store of the Lock section, carry this process's host and pid, and are drained at
// shutdown with the handlers'), running accrue every period.
func NewInterest(lock *flmw.Middleware, every time.Duration, accrue func(ctx context.Context) error) (*Interest, error) {
	l, err := lock.Locker().With(flightlock.WithMode(flightlock.Reject))
	if err != nil {
		return nil, err
	}
	return &Interest{locker: l, every: every, accrue: accrue, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start runs the job on every tick until Stop.
func (j *Interest) Start() {
	defer close(j.done)
	tick := time.NewTicker(j.every)
	defer tick.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-tick.C:
			if !j.runOnce() {
				return
			}
		}
	}
}

// runOnce runs the job if no other instance runs it now, and reports whether to go on.
func (j *Interest) runOnce() bool {
	// Not the shutdown's context: a run that began finishes (the Middleware's drain waits for it
	// up to LockConf.Drain) instead of stopping between two writes. The lease's context, which
	// accrue gets, still ends if the lock is lost.
	err := j.locker.Do(context.Background(), "job:interest", j.accrue)
	switch {
	case err == nil, errors.Is(err, flightlock.ErrBusy): // ran here, or runs elsewhere now
	case errors.Is(err, flightlock.ErrClosed): // the service is shutting down
		return false
	default:
		logx.Errorf("interest job: %v", err)
	}
	return true
}

// Stop ends the ticks and waits for a run in progress to finish.
func (j *Interest) Stop() {
	close(j.stop)
	<-j.done
}

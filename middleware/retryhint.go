package middleware

import (
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
)

// holdTimes estimates how long a rule's locks are held, a moving average from grant to
// release, for a busy answer's Retry-After: a renewed lock's remaining TTL is only the renewal
// period. Concurrent releases may lose a sample, which an estimate tolerates: no CAS loop.
type holdTimes struct {
	avg atomic.Int64 // nanoseconds; 0 until the first release
}

const holdWeight = 8 // a new sample weighs 1/holdWeight: about the last 8 holds

func (t *holdTimes) observe(d time.Duration) {
	d = max(d, time.Microsecond) // 0 means no sample yet
	avg := t.avg.Load()
	if avg == 0 {
		avg = int64(d) // the first sample is the average
	}
	t.avg.Store(avg + (int64(d)-avg)/holdWeight)
}

// retryHint is a busy error with the rule's estimate of how long the key stays busy.
type retryHint struct {
	error
	after time.Duration
}

func (h *retryHint) Unwrap() error { return h.error }

const defaultRetryAfter = time.Second // when neither the holder's TTL nor a hold time is known

// hintBusy gives a busy err the rule's typical hold as its hint when shorter than the holder's
// remaining TTL, or that is unknown; other errors are returned as is (retryDelay reads them).
func hintBusy(err error, holds *holdTimes) error {
	typical := time.Duration(holds.avg.Load())
	if typical <= 0 || !errors.Is(err, flightlock.ErrBusy) {
		return err
	}
	if d, known := flightlock.RetryAfter(err); known && d <= typical {
		return err
	}
	return &retryHint{error: err, after: typical}
}

// retryDelay is how long a busy answer (Retry-After, RetryInfo) tells the client to wait: the
// hint of hintBusy, else the holder's remaining TTL, else defaultRetryAfter.
func retryDelay(err error) time.Duration {
	var h *retryHint
	if errors.As(err, &h) {
		return h.after
	}
	if d, ok := flightlock.RetryAfter(err); ok {
		return d
	}
	return defaultRetryAfter
}

// wholeSeconds is d as Retry-After says it: whole seconds, rounded up.
func wholeSeconds(d time.Duration) string {
	return strconv.Itoa(int((d + time.Second - 1) / time.Second))
}

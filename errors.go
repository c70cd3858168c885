package flightlock

import (
	"errors"
	"fmt"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

var (
	// ErrBusy means another owner holds the key: at once in reject mode, or after the wait
	// budget was spent in wait mode. When the caller's context ended the wait, the error is
	// errors.Join(ErrBusy, ctx.Err()). RetryAfter tells how long the holder has left.
	ErrBusy = errors.New("flightlock: lock busy")
	// ErrNotHeld is returned by Release and Refresh of a lock that is not held by the lease:
	// released already, expired, or taken over. Nothing of the other owner was touched.
	ErrNotHeld = lockstore.ErrNotHeld
	// ErrLost is the cause with which a lease's context is cancelled when the lock can no
	// longer be trusted: a renewal was refused, or the lease ran out before it could be renewed.
	ErrLost = errors.New("flightlock: lock lost")
	// ErrInvalidKey means the lock request is malformed: an empty key, or a key longer than
	// MaxKeyLen (prefix included). Nothing was sent to the store.
	ErrInvalidKey = errors.New("flightlock: invalid lock key")
	// ErrConfig means a Locker's options (New, With) or a middleware's configuration are
	// invalid: a TTL that is not positive, a prefix that leaves no room for a key, an unknown
	// value. It is a start-up error, unlike ErrInvalidKey, which is the request's fault.
	ErrConfig = errors.New("flightlock: invalid configuration")
	// ErrClosed is returned by Lock once the Locker drains (Drain): the process is shutting
	// down and takes no new lock. It is also the cause with which Drain cancels the contexts of
	// leases still held when its grace period ends.
	ErrClosed = errors.New("flightlock: draining, no new locks")
	// ErrReleasePending is returned by a Release whose context ended before the store
	// confirmed the release: it goes on in the background, and the key is freed when the store
	// answers, or runs out with its TTL when it never does. Nobody else's lock is touched.
	ErrReleasePending = errors.New("flightlock: release not confirmed before the context ended; it goes on in the background")
)

// errLateReply is the error of an acquisition whose reply came too late to hold its lock
// safely; the lock was given back.
var errLateReply = errors.New("flightlock: the lock store replied too late to hold the lock safely")

// errGrantEnded tells a re-entry that the lease it found ended meanwhile.
var errGrantEnded = errors.New("flightlock: grant ended")

// MaxKeyLen is the longest store key, prefix included, that a Locker accepts. Longer keys are
// refused with ErrInvalidKey: they cost the store on every call and almost always mean a
// template took in a whole request body.
const MaxKeyLen = 1024

// busyError is ErrBusy with the holder's remaining TTL, for a Retry-After answer.
type busyError struct {
	retryAfter time.Duration
}

func (e *busyError) Error() string {
	if e.retryAfter > 0 {
		return fmt.Sprintf("%s (held for %v more)", ErrBusy.Error(), e.retryAfter.Round(time.Millisecond))
	}
	return ErrBusy.Error()
}

func (e *busyError) Is(target error) bool { return target == ErrBusy }

// RetryAfter returns how long the holder of a busy key still had when err was made, if err is
// an ErrBusy that knows it.
func RetryAfter(err error) (time.Duration, bool) {
	var be *busyError
	if errors.As(err, &be) && be.retryAfter > 0 {
		return be.retryAfter, true
	}
	return 0, false
}

func invalidKey(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidKey}, args...)...)
}

// configError wraps ErrConfig; format names the option first ("WithTTL: must be positive").
func configError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

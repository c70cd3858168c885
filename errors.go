package flightlock

import (
	"errors"
	"fmt"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

var (
	// ErrBusy means another owner holds the key (in wait mode, past the wait budget). When the
	// caller's context ended the wait, the error is errors.Join(ErrBusy, ctx.Err()).
	// RetryAfter tells how long the holder has left.
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
	// invalid: a start-up error, unlike ErrInvalidKey, which is the request's fault.
	ErrConfig = lockstore.ErrConfig
	// ErrClosed is returned by Lock once the Locker drains (Drain), and is the cause with
	// which Drain cancels the leases still held when its grace period ends.
	ErrClosed = errors.New("flightlock: draining, no new locks")
	// ErrReleasePending is returned by a Release whose context ended before the store
	// confirmed it: it goes on in the background, or the key runs out with its TTL.
	ErrReleasePending = errors.New("flightlock: release not confirmed before the context ended; it goes on in the background")
)

// errLateReply is an acquisition's reply too late to hold its lock safely (given back).
var errLateReply = errors.New("flightlock: the lock store replied too late to hold the lock safely")

// errGrantEnded tells a re-entry that the lease it found ended meanwhile.
var errGrantEnded = errors.New("flightlock: grant ended")

// MaxKeyLen is the longest store key, prefix included, that a Locker (ErrInvalidKey) and every
// store (lockstore.CheckArgs) accept: a longer one likely means a template took in a request body.
const MaxKeyLen = lockstore.MaxKeyLen

// busyError is ErrBusy with the holder's remaining TTL, for a Retry-After answer.
type busyError struct{ retryAfter time.Duration }

func (e *busyError) Error() string {
	if e.retryAfter > 0 {
		return fmt.Sprintf("%s (held for %v more)", ErrBusy.Error(), e.retryAfter.Round(time.Millisecond))
	}
	return ErrBusy.Error()
}

func (e *busyError) Is(target error) bool { return target == ErrBusy }

// RetryAfter returns how long the holder of a busy key had left, if err is an ErrBusy that knows.
func RetryAfter(err error) (time.Duration, bool) {
	var be *busyError
	if errors.As(err, &be) && be.retryAfter > 0 {
		return be.retryAfter, true
	}
	return 0, false
}

// wrapf wraps sentinel in a message; ErrConfig's names the option first ("WithTTL: ...").
func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}

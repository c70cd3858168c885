package middleware

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/rest/httpx"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// statusClientClosedRequest is nginx's code for a client that went away, as go-zero logs it.
const statusClientClosedRequest = 499

// Public messages: the causes (addresses, scripts, settings) stay in the logs.
const (
	msgBusy        = "flightlock: lock busy"
	msgUnavailable = "flightlock: lock store unavailable"
	msgEnded       = "flightlock: request ended before the lock was taken"
	msgConfig      = "flightlock: lock misconfigured"
	msgDraining    = "flightlock: shutting down, try another instance"
)

// errStore marks a store's error (even one wrapping a context error) apart from a request's end.
var errStore = errors.New(msgUnavailable)

// ErrNestedLock (with flightlock.ErrBusy) answers a request that would wait for a key held by
// a request of its own trace: a nested call that locks its caller's key. It names the fix.
var ErrNestedLock = errors.New("the key is held by a caller of this request (the same trace): " +
	"a nested call that locks its caller's key would wait for itself; pass the caller's lock owner on " +
	"(UnaryClientInterceptor on the calling client, StreamClientInterceptor for a streaming call; PropagateTo) " +
	"and set TrustOwner, OwnerSecret and " +
	"the same Prefix on this service")

// HTTPStatus returns the REST status that the middleware answers for err, or 0 when err is none of
// the errors below, for a service that shapes its error replies itself (httpx.SetErrorHandlerCtx):
//
//	wraps flightlock.ErrBusy (also joined with a context error)  409 Conflict
//	wraps flightlock.ErrInvalidKey                                400 Bad Request
//	ErrPayloadMismatch (OnBusy share: a key reused, other payload) 422 Unprocessable Entity
//	wraps flightlock.ErrConfig                                    500 Internal Server Error
//	wraps flightlock.ErrClosed (the service is shutting down)     503 Service Unavailable
//	the middleware's "lock store unavailable"                     503 Service Unavailable
//	wraps context.Canceled (the client went away)                 499
//	wraps context.DeadlineExceeded (the request timed out)        503 Service Unavailable
//
// The middleware sets Retry-After on a busy reply before the error handler runs.
func HTTPStatus(err error) int {
	a, _ := answerOf(err)
	return a.http
}

// answer is what the middleware answers, on each transport, for the errors that wrap target;
// msg is the public message, or "" for the error's own text, which names what is wrong. The
// answers are in the order of HTTPStatus's table: the first that applies.
type answer struct {
	target error
	http   int
	grpc   codes.Code
	msg    string
}

var answers = [...]answer{
	{flightlock.ErrBusy, http.StatusConflict, codes.Aborted, msgBusy},
	{flightlock.ErrInvalidKey, http.StatusBadRequest, codes.InvalidArgument, ""},
	{ErrPayloadMismatch, http.StatusUnprocessableEntity, codes.InvalidArgument, ""},
	{flightlock.ErrConfig, http.StatusInternalServerError, codes.Internal, msgConfig},
	{flightlock.ErrClosed, http.StatusServiceUnavailable, codes.Unavailable, msgDraining},
	{errStore, http.StatusServiceUnavailable, codes.Unavailable, msgUnavailable},
	{context.Canceled, statusClientClosedRequest, codes.Canceled, msgEnded},
	{context.DeadlineExceeded, http.StatusServiceUnavailable, codes.DeadlineExceeded, msgEnded},
}

func answerOf(err error) (answer, bool) {
	for _, a := range answers {
		if errors.Is(err, a.target) {
			return a, true
		}
	}
	return answer{}, false
}

// GRPCStatus returns the gRPC status that the interceptors answer for err: Aborted for ErrBusy
// (with a RetryInfo detail: how long the key likely stays busy, a second when unknown),
// InvalidArgument for ErrInvalidKey, Internal for ErrConfig, Unavailable for an unreachable store
// and for ErrClosed, Canceled and DeadlineExceeded for the context's errors. Any other error gets
// status.Convert's, so GRPCStatus(err).Err() is never nil for a non-nil err.
func GRPCStatus(err error) *status.Status {
	if errors.Is(err, ErrNestedLock) {
		msg := "flightlock: " + ErrNestedLock.Error()
		var why ownerRefusal
		if errors.As(err, &why) {
			msg += "; but " + why.Error()
		}
		return status.New(codes.Aborted, msg)
	}
	a, ok := answerOf(err)
	if !ok {
		return status.Convert(err)
	}
	st := status.New(a.grpc, cmp.Or(a.msg, err.Error()))
	if a.target == flightlock.ErrBusy {
		if withInfo, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryDelay(err))}); derr == nil {
			st = withInfo
		}
	}
	return st
}

// lockError marks err, a request's lock error, as the store's if HTTPStatus does not know it.
func lockError(err error) error {
	if HTTPStatus(err) == 0 {
		return fmt.Errorf("%w: %w", errStore, err)
	}
	return err
}

// rpcError is the status error the interceptors answer for err, an error of a request's lock.
func rpcError(err error) error { return GRPCStatus(lockError(err)).Err() }

// writeHTTPError answers a request whose lock could not be taken, through httpx.ErrorCtx so
// that a service's error handler shapes the reply (else HTTPStatus's status and a short text),
// with a busy reply's Retry-After (retryDelay).
func writeHTTPError(w http.ResponseWriter, r *http.Request, err error) {
	err = lockError(err)
	a, _ := answerOf(err)
	switch {
	case a.target == flightlock.ErrBusy:
		w.Header().Set("Retry-After", wholeSeconds(retryDelay(err)))
	case errors.Is(err, flightlock.ErrClosed):
		w.Header().Set("Retry-After", "1") // another instance can serve it now
	}
	httpx.ErrorCtx(r.Context(), w, err, func(w http.ResponseWriter, err error) {
		http.Error(w, cmp.Or(a.msg, err.Error()), a.http)
	})
}

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

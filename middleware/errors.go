package middleware

import (
	"context"
	"errors"
	"net/http"
	"strconv"
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

// Public messages: the causes (Redis addresses, scripts) stay in the logs.
const (
	msgBusy        = "flightlock: lock busy"
	msgUnavailable = "flightlock: lock store unavailable"
	msgEnded       = "flightlock: request ended before the lock was taken"
)

// errStore marks an error of the store (Redis unreachable), as opposed to the request's own
// context ending, even when the store's error wraps a context error of its own.
var errStore = errors.New(msgUnavailable)

// httpStatus maps a lock error to its REST status, per the design's error table. Contention
// is always below 500, so that go-zero's breakers do not count it as a failure.
func httpStatus(err error) int {
	switch {
	case errors.Is(err, flightlock.ErrBusy):
		return http.StatusConflict
	case errors.Is(err, flightlock.ErrInvalidKey):
		return http.StatusBadRequest
	case errors.Is(err, errStore):
		return http.StatusServiceUnavailable
	case errors.Is(err, context.Canceled):
		return statusClientClosedRequest
	default: // the store is unreachable, or the request timed out before the lock
		return http.StatusServiceUnavailable
	}
}

// writeHTTPError answers a request whose lock could not be taken. It goes through
// httpx.ErrorCtx, so an error handler set with httpx.SetErrorHandlerCtx shapes the reply (it
// sees err, which wraps flightlock.ErrBusy or ErrInvalidKey); without one the reply is the
// status of httpStatus with a short text body. A busy reply carries Retry-After in whole
// seconds, rounded up, from the holder's remaining TTL (1 when unknown).
func writeHTTPError(w http.ResponseWriter, r *http.Request, err error) {
	code := httpStatus(err)
	if code == http.StatusConflict {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds(err)))
	}
	httpx.ErrorCtx(r.Context(), w, err, func(w http.ResponseWriter, err error) {
		http.Error(w, publicMessage(err), code)
	})
}

func retryAfterSeconds(err error) int {
	d, ok := flightlock.RetryAfter(err)
	if !ok {
		return 1
	}
	return int((d + time.Second - 1) / time.Second)
}

func publicMessage(err error) string {
	switch {
	case errors.Is(err, flightlock.ErrBusy):
		return msgBusy
	case errors.Is(err, flightlock.ErrInvalidKey):
		return err.Error() // tells the client which value is missing
	case errors.Is(err, errStore):
		return msgUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return msgEnded
	default:
		return msgUnavailable
	}
}

// grpcStatus maps a lock error to its gRPC status, per the design's error table. A busy
// status carries a RetryInfo detail with the holder's remaining TTL when it is known.
func grpcStatus(err error) *status.Status {
	switch {
	case errors.Is(err, flightlock.ErrBusy):
		st := status.New(codes.Aborted, msgBusy)
		if d, ok := flightlock.RetryAfter(err); ok {
			if withInfo, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); derr == nil {
				st = withInfo
			}
		}
		return st
	case errors.Is(err, flightlock.ErrInvalidKey):
		return status.New(codes.InvalidArgument, err.Error())
	case errors.Is(err, errStore):
		return status.New(codes.Unavailable, msgUnavailable)
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, msgEnded)
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, msgEnded)
	default:
		return status.New(codes.Unavailable, msgUnavailable)
	}
}

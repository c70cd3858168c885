package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/middleware/rules"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrorMapping(t *testing.T) {
	storeDown := fmt.Errorf("%w: %w", errStore, fmt.Errorf("dial: %w", context.DeadlineExceeded))
	tests := []struct {
		name string
		err  error
		http int
		grpc codes.Code
	}{
		{"busy", flightlock.ErrBusy, http.StatusConflict, codes.Aborted},
		{"busy when the wait ended", errors.Join(flightlock.ErrBusy, context.DeadlineExceeded), http.StatusConflict, codes.Aborted},
		{"bad key", fmt.Errorf("%w: no value for {uid}", flightlock.ErrInvalidKey), http.StatusBadRequest, codes.InvalidArgument},
		{"bad config", rules.FieldError("Lock.TTL", "must not be negative"), http.StatusInternalServerError, codes.Internal},
		{"store down", storeDown, http.StatusServiceUnavailable, codes.Unavailable},
		{"client gone", context.Canceled, statusClientClosedRequest, codes.Canceled},
		{"deadline", context.DeadlineExceeded, http.StatusServiceUnavailable, codes.DeadlineExceeded},
		// Not a lock error: HTTPStatus leaves the status to the service, GRPCStatus gives what
		// gRPC would send for it.
		{"the service's own error", errors.New("out of stock"), 0, codes.Unknown},
		{"a status of the service", status.Error(codes.NotFound, "no such order"), 0, codes.NotFound},
		{"nil", nil, 0, codes.OK},
	}
	for _, tt := range tests {
		if got := HTTPStatus(tt.err); got != tt.http {
			t.Errorf("%s: HTTPStatus %d, want %d", tt.name, got, tt.http)
		}
		if got := GRPCStatus(tt.err).Code(); got != tt.grpc {
			t.Errorf("%s: GRPCStatus %v, want %v", tt.name, got, tt.grpc)
		}
		if tt.err != nil && GRPCStatus(tt.err).Err() == nil {
			t.Errorf("%s: GRPCStatus(err).Err() is nil", tt.name)
		}
	}
}

// An error of the lock path that the mapping does not know (a store error that came back as
// the request ended) is answered as the store's, as before HTTPStatus was exported.
func TestLockPathErrorIsTheStores(t *testing.T) {
	err := errors.New("redis: connection reset")
	if got := HTTPStatus(lockError(err)); got != http.StatusServiceUnavailable {
		t.Errorf("REST %d, want 503", got)
	}
	if got := status.Code(rpcError(err)); got != codes.Unavailable {
		t.Errorf("gRPC %v, want Unavailable", got)
	}
	if !errors.Is(lockError(err), err) {
		t.Error("the cause is lost")
	}
	if known := flightlock.ErrBusy; lockError(known) != known {
		t.Error("a known error is wrapped again")
	}
}

// A busy status carries the holder's remaining TTL as a RetryInfo detail.
func TestGRPCStatusRetryInfo(t *testing.T) {
	tr := newTestRedis(t)
	holdKey(t, tr, "order:1")
	_, err := tr.locker(t).TryLock(context.Background(), "order:1")
	if !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("TryLock of a held key: %v, want ErrBusy", err)
	}
	st := GRPCStatus(err)
	if st.Code() != codes.Aborted {
		t.Fatalf("code %v, want Aborted", st.Code())
	}
	var info *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			info = ri
		}
	}
	if info == nil || info.RetryDelay.AsDuration() <= 0 || info.RetryDelay.AsDuration() > 5*time.Second {
		t.Fatalf("details %v, want a RetryInfo of at most the TTL (5s)", st.Details())
	}
}

// A busy error that tells no holder's TTL (a duplicate of this process's own run, a busy error
// built by hand) still answers a RetryInfo, as REST answers Retry-After: 1.
func TestGRPCStatusOfABusyErrorWithoutAHintSaysASecond(t *testing.T) {
	st := GRPCStatus(fmt.Errorf("wrapped: %w", flightlock.ErrBusy))
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if st.Code() != codes.Aborted || delay != time.Second {
		t.Fatalf("status %v, RetryInfo %v; want Aborted with 1s", st.Code(), delay)
	}
}

// A nested call refused for want of its caller's owner names the client interceptor of each
// kind of call: a caller that reaches the downstream method through a stream passes owners on
// only through StreamClientInterceptor, and a message naming the unary one alone sends its
// reader to a client that already has it.
func TestNestedLockNamesTheClientInterceptorOfEachKindOfCall(t *testing.T) {
	msg := GRPCStatus(fmt.Errorf("%w: %w", flightlock.ErrBusy, ErrNestedLock)).Message()
	for _, want := range []string{"UnaryClientInterceptor", "StreamClientInterceptor", "PropagateTo", "TrustOwner", "OwnerSecret"} {
		if !strings.Contains(msg, want) {
			t.Errorf("nested-lock status %q does not name %s", msg, want)
		}
	}
}

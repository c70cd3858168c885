package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/flightlock/flightlock"
	"google.golang.org/grpc/codes"
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
		{"store down", storeDown, http.StatusServiceUnavailable, codes.Unavailable},
		{"client gone", context.Canceled, statusClientClosedRequest, codes.Canceled},
		{"deadline", context.DeadlineExceeded, http.StatusServiceUnavailable, codes.DeadlineExceeded},
	}
	for _, tt := range tests {
		if got := httpStatus(tt.err); got != tt.http {
			t.Errorf("%s: HTTP %d, want %d", tt.name, got, tt.http)
		}
		if got := grpcStatus(tt.err).Code(); got != tt.grpc {
			t.Errorf("%s: gRPC %v, want %v", tt.name, got, tt.grpc)
		}
	}
}

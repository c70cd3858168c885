// Package rpcstatus maps the example's errors to gRPC status codes, in one place for both
// zrpc services. go-zero's httpx.ErrorCtx maps those codes on to HTTP statuses when the order
// API returns them.
package rpcstatus

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/example/internal/state"
)

// FromError returns err as a gRPC status error. ctx is the handler's context: when it was
// cancelled because the lock was lost, the failure is reported as Aborted whatever the store
// said, since the write was (or would have been) made without the lock.
func FromError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(context.Cause(ctx), flightlock.ErrLost) {
		return status.Error(codes.Aborted, flightlock.ErrLost.Error()+": "+err.Error())
	}
	switch {
	case errors.Is(err, state.ErrInvalidID):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, state.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, state.ErrInsufficient):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, state.ErrStaleFence), errors.Is(err, flightlock.ErrBusy):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, state.ErrNoLease):
		return status.Error(codes.Internal, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}

// InvalidArgument returns an InvalidArgument status error.
func InvalidArgument(msg string) error { return status.Error(codes.InvalidArgument, msg) }

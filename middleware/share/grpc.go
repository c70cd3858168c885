package share

import (
	"context"
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/flightlock/flightlock/middleware/internal/sharehook"
)

// HandleRPC answers a share rule's call with the reply, or error status, of the call that ran.
func (rl *rule) HandleRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo,
	handler grpc.UnaryHandler, keys []string) (any, error) {
	msg, _ := req.(proto.Message) // nil, an empty payload, for a request that is not one
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "flightlock: fingerprint the request: %v", err)
	}
	print := fingerprint([]byte(info.FullMethod), payload)
	rec, err := rl.share(ctx, keys, keys, print, func(ctx context.Context, fence int64) (*record, bool, error) {
		resp, herr := handler(ctx, req)
		rec := &record{Fence: fence, Print: print}
		if herr != nil {
			st, ok := status.FromError(herr)
			if !ok { // a bare error: a context's answers as grpc-go does (FromContextError)
				st = status.FromContextError(herr)
			}
			// Code and Msg too, for processes of an earlier version that read this record.
			rec.Code, rec.Msg, rec.err = int(st.Code()), st.Message(), herr
			if b, err := proto.Marshal(st.Proto()); err == nil {
				rec.St = b
			}
			// Canceled and DeadlineExceeded tell of the caller's context: never another's answer.
			keep := st.Code() != codes.Canceled && st.Code() != codes.DeadlineExceeded
			return rec, keep && rl.classes[rpcClass(st.Code())], nil
		}
		msg, ok := resp.(proto.Message)
		if !ok {
			return nil, false, fmt.Errorf("flightlock: the reply %T of a share rule is not a proto message", resp)
		}
		b, err := proto.Marshal(msg)
		if err != nil {
			return nil, false, fmt.Errorf("flightlock: marshal the shared reply: %w", err)
		}
		rec.Type, rec.Body, rec.reply = string(msg.ProtoReflect().Descriptor().FullName()), b, msg
		return rec, rl.classes[2], nil
	})
	var pe *panicError
	switch {
	case errors.As(err, &pe):
		return nil, status.Error(codes.Internal, pe.Error())
	case err != nil: // ErrPayloadMismatch among them: InvalidArgument
		return nil, rl.g.conf.RPCError(err)
	}
	if rec.replayed {
		_ = grpc.SetHeader(ctx, metadata.Pairs(sharehook.ReplayedMetadata, "true"))
	}
	if rec.Code != int(codes.OK) {
		return nil, rec.rpcError()
	}
	if !rec.replayed && rec.reply != nil {
		return rec.reply, nil // the call that ran the handler returns its own reply
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(rec.Type))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "flightlock: shared reply type %q: %v", rec.Type, err)
	}
	reply := mt.New().Interface()
	if err := proto.Unmarshal(rec.Body, reply); err != nil {
		return nil, status.Errorf(codes.Internal, "flightlock: shared reply: %v", err)
	}
	return reply, nil
}

// rpcError is the error of a zrpc record: the handler's own error for the call that ran it,
// else its whole status as stored, details included, or, in a record stored before statuses
// were, its code and message.
func (rec *record) rpcError() error {
	if !rec.replayed && rec.err != nil {
		return rec.err
	}
	if len(rec.St) > 0 {
		var sp spb.Status
		if err := proto.Unmarshal(rec.St, &sp); err == nil {
			return status.FromProto(&sp).Err()
		}
	}
	return status.Error(codes.Code(rec.Code), rec.Msg)
}

// rpcClass is the HTTP status class a gRPC code answers for, as go-zero's gateway maps them.
func rpcClass(c codes.Code) int {
	switch c {
	case codes.OK:
		return 2
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.OutOfRange, codes.Aborted, codes.Canceled:
		return 4
	}
	return 5
}

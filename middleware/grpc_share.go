package middleware

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/zeromicro/go-zero/core/logx"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// ReplayedMetadata is the response header (gRPC metadata) that marks a reply a duplicate
// received from the call that ran the handler.
const ReplayedMetadata = "idempotent-replayed"

// serveSharedRPC is the unary interceptor's work for a share rule (see share): the reply
// message, or the error status, of the call that ran the handler.
func (m *Middleware) serveSharedRPC(ctx context.Context, rl *rule, req any, info *grpc.UnaryServerInfo,
	handler grpc.UnaryHandler, keys []string) (any, error) {
	var payload []byte
	if msg, ok := req.(proto.Message); ok {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "flightlock: fingerprint the request: %v", err)
		}
		payload = b
	}
	print := fingerprint([]byte(info.FullMethod), payload)
	rkey := m.replayKey(keys)
	rec, err := m.share(ctx, rl, rkey, print, func() (*record, error) {
		return m.runRPCShared(ctx, rl, req, handler, keys, rkey, print)
	})
	var pe *panicError
	switch {
	case errors.As(err, &pe):
		return nil, status.Error(codes.Internal, pe.Error())
	case err != nil: // ErrPayloadMismatch among them: InvalidArgument
		return nil, grpcStatus(err).Err()
	}
	if rec.replayed {
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
	}
	if rec.Code != int(codes.OK) {
		return nil, status.Error(codes.Code(rec.Code), rec.Msg)
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

// runRPCShared is the leader's run of a zrpc share rule.
func (m *Middleware) runRPCShared(ctx context.Context, rl *rule, req any, handler grpc.UnaryHandler,
	keys []string, rkey, print string) (rec *record, err error) {
	h, err := m.lock(ctx, rl, keys)
	if err != nil {
		return nil, err
	}
	defer m.release(ctx, rl, h)
	if stored, err := m.replays.load(ctx, rkey); err == nil && stored != nil {
		m.countShare(rl, "stored")
		return stored, nil
	}
	var resp any
	var herr error
	func() {
		defer func() {
			if v := recover(); v != nil {
				err = &panicError{value: v, stack: debug.Stack()}
				logx.WithContext(ctx).Errorf("%v\n%s", v, err.(*panicError).stack)
			}
		}()
		resp, herr = handler(h.ctx, req)
	}()
	if err != nil {
		return nil, err
	}
	rec = &record{Fence: fenceOf(h), Print: print}
	class := 2
	if herr != nil {
		st := status.Convert(herr)
		rec.Code, rec.Msg, class = int(st.Code()), st.Message(), rpcClass(st.Code())
	} else if msg, ok := resp.(proto.Message); ok {
		b, merr := proto.Marshal(msg)
		if merr != nil {
			return nil, fmt.Errorf("flightlock: marshal the shared reply: %w", merr)
		}
		rec.Type, rec.Body, rec.reply = string(msg.ProtoReflect().Descriptor().FullName()), b, msg
	} else {
		return nil, fmt.Errorf("flightlock: the reply %T of a share rule is not a proto message", resp)
	}
	m.storeRecord(ctx, rl, rkey, rec, rl.share.classes[class])
	return rec, nil
}

// rpcClass is the HTTP status class a gRPC code answers for, as go-zero's gateway maps them:
// 2 for OK, 4 for the caller's mistakes, 5 for the server's (Unavailable, Internal, ...), which
// are never stored by default so that a retry runs the handler again.
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

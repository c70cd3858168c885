//go:build knownbugs

// A known limitation, found by the review of d01fe15 on 2026-11-27 and not fixed: propagated
// streams take no re-entry slot (withOutgoingOwners), so two streams of one hold, opened by one
// goroutine or by two, have their downstream handlers inside at once. It fails on the current
// code and ran the same before d01fe15; run it with
// go test -race -tags knownbugs -run TestReviewOneGoroutineTwoStreamsTakeTurns ./middleware.
// A fix gives each stream a slot entry of its own, released when gRPC ends the stream
// (cs.Context() done), without deadlocking a goroutine that is inside the slot itself.

package middleware

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// openStream opens the Stream method (locked on s:{host}) with host 1 and reads its first
// reply, which the server sends from inside its re-entry of s:1.
func openStream(ctx context.Context, conn *grpc.ClientConn) (grpc.ClientStream, string, error) {
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, fullMethod("Stream"))
	if err != nil {
		return nil, "", err
	}
	if err := cs.SendMsg(&rpb.ServerReflectionRequest{Host: "1"}); err != nil {
		return nil, "", err
	}
	reply := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(reply); err != nil {
		return nil, "", err
	}
	return cs, reply.GetValue(), nil
}

// The slot belongs to a goroutine, and a goroutine already inside enters again at once. A
// stream outlives the interceptor call, so one goroutine that opens two streams under the same
// hold has both downstream handlers inside re-entries of s:1 at the same time: the exclusion
// README promises ("one call at a time is on its way under each held lock") does not hold for
// streams opened by one goroutine. (Sequential in-process re-entries of one goroutine are one
// call chain; two open streams are two concurrent handlers.)
func TestReviewOneGoroutineTwoStreamsTakeTurns(t *testing.T) {
	tr := newTestRedis(t)
	conn, holder := fanOutConn(t, tr, echoLeases)
	lease, err := holder.Lock(context.Background(), "s:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	ctx, cancel := context.WithCancel(lease.Context())
	defer cancel()

	first, keys, err := openStream(ctx, conn)
	if err != nil || keys != "lock:s:1" {
		t.Fatalf("first stream: %q, %v", keys, err)
	}
	defer first.CloseSend()
	short, cancel2 := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel2()
	second, keys, err := openStream(short, conn) // the same goroutine
	if err == nil {
		defer second.CloseSend()
		t.Fatalf("a second stream of the same goroutine opened (server inside with %q) while the first "+
			"stream's handler is inside its re-entry of s:1", keys)
	}
}

package middleware

// Streams under a handed-over owner (handover.EnterStream): a stream takes its turn under each
// held lock for as long as it lasts, under a slot entry of its own, released when gRPC ends
// the stream. Before, streams took no slot: two streams of one hold, from one goroutine or
// two, had their downstream handlers inside at once (review of d01fe15:
// TestReviewOneGoroutineTwoStreamsTakeTurns, kept behind -tags knownbugs until this change).

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
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

// One goroutine that opens a second stream under the hold while its first is open cannot wait
// for its own stream: the second stream's key is withheld, so its handler does not get into
// s:1 beside the first one's (it waits for the key and the call ends first).
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

// Streams of two goroutines take turns: the second opens once the first is over (read to
// io.EOF); a client-streaming call, which ends with CloseSend and one RecvMsg that returns
// nil, lets the next one in too; and a stream abandoned by its context does.
func TestHandedOwnerStreamsTakeTurns(t *testing.T) {
	tr := newTestRedis(t)
	conn, holder := fanOutConn(t, tr, echoLeases)
	lease, err := holder.Lock(context.Background(), "s:1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := lease.Context()

	first, keys, err := openStream(ctx, conn)
	if err != nil || keys != "lock:s:1" {
		t.Fatalf("first stream: keys %q, %v", keys, err)
	}
	opened := make(chan error, 1)
	go func() {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, _, err := openStream(c, conn)
		if err == nil {
			_ = s.CloseSend()
			err = s.RecvMsg(new(wrapperspb.StringValue))
			if err == io.EOF {
				err = nil
			}
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		t.Fatalf("a second goroutine's stream under the same hold opened while the first was inside (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := first.RecvMsg(new(wrapperspb.StringValue)); err != io.EOF {
		t.Fatalf("first stream ended with %v, want io.EOF", err)
	}
	if err := <-opened; err != nil {
		t.Fatalf("second stream, after the first ended: %v", err)
	}

	// A client-streaming call: CloseSend, then one RecvMsg that returns nil.
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, fullMethod("Stream"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&rpb.ServerReflectionRequest{Host: "1"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(wrapperspb.StringValue)); err != nil {
		t.Fatalf("client-streaming call: %v", err)
	}
	after := func(what string) {
		t.Helper()
		errc := make(chan error, 1)
		go func() { // a goroutine inside no slot: it waits for a slot that was not given back
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := call(c, conn, "Host", &rpb.ServerReflectionRequest{Host: "2"})
			errc <- err
		}()
		if err := <-errc; err != nil {
			t.Fatalf("a call after %s: %v (%v); its stream's turn was never given back", what, err, status.Code(err))
		}
	}
	after("a finished client-streaming call")

	// A stream abandoned by its context, never read to its end.
	abandon, cancel := context.WithCancel(ctx)
	if _, _, err := openStream(abandon, conn); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	errc := make(chan error, 1)
	go func() {
		_, err := call(short, conn, "Host", &rpb.ServerReflectionRequest{Host: "2"})
		errc <- err
	}()
	if err := <-errc; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call while another goroutine's stream is inside: %v, want DeadlineExceeded", err)
	}
	cancelShort()
	cancel()
	after("a stream abandoned by its context")

	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	free, cancelFree := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelFree()
	next, err := tr.locker(t).Lock(free, "s:1")
	if err != nil {
		t.Fatalf("s:1 after its holder released, with every stream over: %v", err)
	}
	_ = next.Release(context.Background())
}

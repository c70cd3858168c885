package etcdstore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/lockstore"
)

// Clean-ups a call makes when etcd goes quiet in the middle of it (giving back a hold it wrote,
// leaving a fair line) run beside the caller, not in its time: the call returns by its deadline.

// withinDeadline runs call with a deadline d away and fails t when it returned past it by more
// than the scheduling slack the machine showed meanwhile.
func withinDeadline(t *testing.T, what string, d time.Duration, call func(context.Context) (lockstore.Acquisition, error)) {
	t.Helper()
	probe := poll.StartLagProbe(t)
	probe.Lag()
	ctx, cancel := context.WithTimeout(bg(t), d)
	defer cancel()
	deadline, _ := ctx.Deadline()
	got, err := call(ctx)
	t.Logf("%s = %+v, %v", what, got, err)
	if over, lag := time.Since(deadline), probe.Lag(); over > poll.DeadlineSlack+lag {
		t.Errorf("%s returned %v past its %v deadline (scheduling lag %v)", what, over, d, lag)
	}
}

// stallAfterPut, once armed, makes keep-alive streams and every Txn after the second (Reenter's
// read, then its put of the hold) hang until their context ends: a member that goes silent right
// after it applied the re-entry's put.
type stallAfterPut struct {
	armed atomic.Bool
	txns  atomic.Int32
}

func (s *stallAfterPut) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if s.armed.Load() && method == "/etcdserverpb.KV/Txn" && s.txns.Add(1) > 2 {
		<-ctx.Done()
		return ctx.Err()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (s *stallAfterPut) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if s.armed.Load() && method == "/etcdserverpb.Lease/LeaseKeepAlive" {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// A handed-over re-entry whose keep-alive of the holder's lease gets no answer gives its hold
// back after it returned, not before.
func TestReenterReturnsByItsDeadlineWhenEtcdGoesQuiet(t *testing.T) {
	c := etcdtest.Start(t)
	f := &stallAfterPut{}
	holder, s := newStore(t, c.Client(t)), newStore(t, faultyClient(t, c, f.unary, f.stream))
	const ttl = 2 * time.Second
	if got, err := holder.Acquire(bg(t), lockstore.Request{Key: "lock:handed", Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	f.armed.Store(true)
	defer f.armed.Store(false)
	withinDeadline(t, "Reenter", 300*time.Millisecond, func(ctx context.Context) (lockstore.Acquisition, error) {
		return s.Reenter(ctx, "lock:handed", ownerA, "h1", ttl)
	})
}

// lostGrantReply, once armed, lets the next Txn apply but holds its reply back until the caller
// gives up on it (a reply lost with a leader change or a cut); every DeleteRange after that
// hangs until its context ends.
type lostGrantReply struct {
	armed, stallDeletes atomic.Bool
}

func (f *lostGrantReply) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch {
	case method == "/etcdserverpb.KV/Txn" && f.armed.CompareAndSwap(true, false):
		err := invoker(ctx, method, req, reply, cc, opts...)
		f.stallDeletes.Store(true)
		if err == nil {
			<-ctx.Done()
			return ctx.Err()
		}
		return err
	case method == "/etcdserverpb.KV/DeleteRange" && f.stallDeletes.Load():
		<-ctx.Done()
		return ctx.Err()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// A fair acquisition whose grant reply was lost is sent again, finds the key its owner's, and
// leaves its place in line beside the caller: it returns by its deadline even when that delete
// gets no answer.
func TestFairResentGrantReturnsByItsDeadlineWhenEtcdGoesQuiet(t *testing.T) {
	c := etcdtest.Start(t)
	f := &lostGrantReply{}
	holder, s := newStore(t, c.Client(t)), newStore(t, faultyClient(t, c, f.unary, nil))
	ctx := bg(t)
	const ttl, key = 2 * time.Second, "lock:fair"
	if got, err := holder.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	fair := lockstore.Request{Key: key, Owner: ownerA, TTL: ttl, Asked: time.Now(), Queue: 2 * time.Second}
	if got, err := s.Acquire(ctx, fair); err != nil || got.Acquired {
		t.Fatal("the fair waiter was not refused", got, err)
	}
	if _, err := holder.Release(ctx, key, ownerB, "", 0); err != nil {
		t.Fatal(err)
	}
	f.armed.Store(true)
	defer f.stallDeletes.Store(false)
	withinDeadline(t, "fair Acquire", 1200*time.Millisecond, func(ctx context.Context) (lockstore.Acquisition, error) {
		return s.Acquire(ctx, fair)
	})
}

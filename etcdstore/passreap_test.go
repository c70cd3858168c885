package etcdstore

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// A pass whose compare transaction is slow (a leader election, say) must not let the moment
// the store counts on the lock run out meanwhile: the store's reaper would take the entry and
// delete the lock (here with its own transaction delayed on the wire) after Pass reported it
// kept for a TTL. Found by review; it failed 3 of 3 runs before claimPass.
func TestPassRacesTheReaper(t *testing.T) {
	c := etcdtest.Start(t)
	delays := make(chan time.Duration, 2)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/etcdserverpb.KV/Txn" {
				select {
				case d := <-delays:
					time.Sleep(d)
				default:
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	ctx := bg(t)
	a, b := newStore(t, cli), newStore(t, cli)
	const ttl = 3 * time.Second
	got, err := a.Acquire(ctx, lockstore.Request{Key: "lock:x", Owner: ownerA, TTL: ttl})
	if err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	// The holder's guarantee has 1.1s left (the Locker passes a lock with more than TTL/3 left).
	a.update("lock:x", ownerA, func(e *heldKey) { e.until = time.Now().Add(1100 * time.Millisecond) })
	delays <- 1300 * time.Millisecond // the pass's compare transaction
	delays <- 900 * time.Millisecond  // the next transaction: a reaper's release, were there one
	start := time.Now()
	kept, _, _, err := a.Pass(ctx, "lock:x", ownerA, ttl, 0)
	if err != nil || !kept {
		t.Fatalf("pass = %v, %v; want kept", kept, err)
	}
	// The pass promised the lock lives at least until start + TTL.
	for time.Since(start) < ttl-200*time.Millisecond {
		if get(t, cli, "lock:x") == nil {
			o, err := b.Acquire(ctx, lockstore.Request{Key: "lock:x", Owner: ownerB, TTL: ttl})
			t.Fatalf("the kept lock was deleted %v after the pass began (promised %v); another owner's acquire = %+v, %v",
				time.Since(start), ttl, o, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := a.Release(ctx, "lock:x", ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
}

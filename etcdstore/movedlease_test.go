package etcdstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// The owner releases its own hold while a re-entry from another process remains: the key
// moves to a lease granted for it (release.go, release). The grant and the move are two
// round trips; when the move is slow, a refresh of the re-entry that reads the key still on
// the owner's session lease in between returns nil, promising the lock its TTL from the
// refresh, while the key then sits on the new lease, whose TTL started before that refresh.
func TestRefreshDuringAMoveKeepsItsPromise(t *testing.T) {
	c := etcdtest.Start(t)
	var watching, granted atomic.Bool
	upCli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			switch {
			case method == "/etcdserverpb.Lease/LeaseGrant" && watching.Load():
				// The release's grant of a lease for the re-entries left: the move follows.
				err := invoker(ctx, method, req, reply, cc, opts...)
				granted.Store(true)
				return err
			case method == "/etcdserverpb.KV/Txn" && granted.Load():
				granted.Store(false)
				time.Sleep(2500 * time.Millisecond) // the move, slow on the wire
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = upCli.Close() })
	downCli := c.Client(t)
	ctx := bg(t)
	up, down, other := newStore(t, upCli), newStore(t, downCli), newStore(t, downCli)
	const ttl = 2 * time.Second
	if got, err := up.Acquire(ctx, lockstore.Request{Key: "lock:m", Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	if got, err := down.Reenter(ctx, "lock:m", ownerA, "h1", ttl); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	// Arm the delay of the transaction that follows the release's grant.
	watching.Store(true)
	var wg sync.WaitGroup
	var tg time.Time
	wg.Go(func() {
		tg = time.Now()
		if _, err := up.Release(ctx, "lock:m", ownerA, "", 0); err != nil {
			t.Error(err)
		}
	})
	time.Sleep(2200 * time.Millisecond) // grant sent; the move still on the wire
	start := time.Now()
	if err := down.Refresh(ctx, "lock:m", ownerA, ttl); err != nil {
		t.Fatalf("refresh of the re-entry: %v", err)
	}
	wg.Wait()
	t.Logf("refresh %v after the release began", start.Sub(tg).Round(time.Millisecond))
	for time.Since(start) < ttl-200*time.Millisecond {
		if get(t, downCli, "lock:m") == nil {
			got, err := other.Acquire(ctx, lockstore.Request{Key: "lock:m", Owner: ownerB, TTL: ttl})
			t.Fatalf("the re-entered lock is gone %v after a refresh that promised %v; another owner's acquire = %+v, %v",
				time.Since(start).Round(time.Millisecond), ttl, got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, _ = down.Release(ctx, "lock:m", ownerA, "h1", 0)
}

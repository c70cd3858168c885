package etcdstore

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// A refresh that comes once the store's reaper has the entry (the holder's guarantee ran out,
// and the reaper's owner-checked delete is on its way) must not be answered nil: the delete
// commits after the refresh's read, and the holder would count on a lock another owner can
// take. The reaper's transaction is held before it goes on the wire while the refresh runs.
func TestRefreshOfALockTheReaperEndsIsNotHeld(t *testing.T) {
	c := etcdtest.Start(t)
	var gate atomic.Pointer[chan struct{}] // when set, the next Txn waits for it to close
	entered := make(chan struct{}, 1)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
			cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/etcdserverpb.KV/Txn" {
				if g := gate.Swap(nil); g != nil {
					entered <- struct{}{}
					select {
					case <-*g:
					case <-ctx.Done():
						return ctx.Err()
					}
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
	a, b := quiet(newStore(t, cli)), newStore(t, cli) // a's reaper runs only when the test starts it
	const ttl = 2 * time.Second
	if got, err := a.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	// The holder's guarantee ran out: the reaper takes the entry, and its release waits at the gate.
	a.update("lock:r", ownerA, func(e *heldKey) { e.until = time.Now().Add(-time.Millisecond) })
	release := make(chan struct{})
	gate.Store(&release)
	a.startReaper(time.Now())
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the reaper sent no release")
	}
	refreshed := a.Refresh(ctx, "lock:r", ownerA, ttl)
	close(release)
	waitFor(t, 5*time.Second, "the reaper's release done", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return !a.reaping
	})
	if refreshed == nil {
		if kv := get(t, cli, "lock:r"); kv == nil || !ownedBy(kv.Value, ownerA) {
			o, err := b.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerB, TTL: ttl})
			t.Fatalf("Refresh answered nil, then the reaper deleted the lock (now %v); another owner's acquire = %+v, %v",
				kv, o, err)
		}
		return
	}
	if !errors.Is(refreshed, lockstore.ErrNotHeld) {
		t.Fatalf("Refresh of a lock the reaper ends = %v, want ErrNotHeld", refreshed)
	}
	if got, err := b.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerB, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatalf("another owner after the reaper's release: %+v, %v; want acquired", got, err)
	}
}

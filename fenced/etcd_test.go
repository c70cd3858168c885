package fenced_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/fenced"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// The fenced writes take a fence whichever store made it: a holder of an etcd lock
// that stalls until its lock is gone, while a holder in another process takes the key and
// writes, is refused when it resumes; the newer holder's writes stand. The lock is in etcd, the
// data in Redis, as a service that keeps its balances' locks in etcd and its data in Redis has.
func TestStaleWriterWithEtcdFences(t *testing.T) {
	ec := etcdtest.Start(t)
	rdb := redistest.Start(t).Client()
	ctx := context.Background()

	lockerIn := func() *flightlock.Locker { // a process of its own: its own client and store
		store, err := etcdstore.New(ec.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		l, err := flightlock.New(store, flightlock.WithPrefix("flightlock/lock:"), flightlock.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	stalled, current := lockerIn(), lockerIn()

	first, err := stalled.Lock(ctx, "acct:7")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenced.HIncrBy(ctx, rdb, "balance:7", "cents", 1_000, first.Fence()); err != nil {
		t.Fatal(err)
	}
	// The first holder stalls; its lock goes (here: deleted in etcd, as its lease's end would
	// delete it) and a holder in another process takes the key and writes twice.
	if _, err := ec.Client(t).Delete(ctx, "flightlock/lock:acct:7"); err != nil {
		t.Fatal(err)
	}
	second, err := current.Lock(ctx, "acct:7")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	if second.Fence() <= first.Fence() {
		t.Fatalf("the second grant's fence %d is not above the first's %d", second.Fence(), first.Fence())
	}
	for range 2 {
		if _, err := fenced.HIncrBy(ctx, rdb, "balance:7", "cents", -300, second.Fence(), fenced.AtLeast(0)); err != nil {
			t.Fatalf("the current holder's write: %v", err)
		}
	}
	// The first holder resumes and writes what it computed before its stall.
	if _, err := fenced.HIncrBy(ctx, rdb, "balance:7", "cents", -1_000, first.Fence()); !errors.Is(err, fenced.ErrStaleFence) {
		t.Fatalf("the stale holder's debit: %v, want ErrStaleFence", err)
	}
	if v := rdb.HGet(ctx, "balance:7", "cents").Val(); v != "400" {
		t.Errorf("cents = %s, want 400 (1000 - 300 - 300): a stale write got through", v)
	}
	if f, err := fenced.Fence(ctx, rdb, "balance:7"); err != nil || f != second.Fence() {
		t.Errorf("the data's fence = %d, %v; want the current holder's %d", f, err, second.Fence())
	}
	if err := first.Release(ctx); !errors.Is(err, flightlock.ErrNotHeld) && err != nil {
		t.Errorf("the stale holder's release: %v", err)
	}
}

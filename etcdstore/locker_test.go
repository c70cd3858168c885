package etcdstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// flightlock's Locker on the store, two processes (stores on clients of their own), eight
// goroutines each on one key: no overlap, fences strictly increasing across grants from etcd
// and handoffs in a process, and a lock held for three TTLs keeps its context (the watchdog's
// RefreshAll renews it, and the store does not release it).
func TestLockerOnEtcd(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := bg(t)
	lockers := make([]*flightlock.Locker, 2)
	for i := range lockers {
		l, err := flightlock.New(newStore(t, c.Client(t)), flightlock.WithTTL(2*time.Second), flightlock.WithWait(20*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Drain(context.Background()) })
		lockers[i] = l
	}

	long := make(chan error, 1)
	go func() {
		long <- lockers[0].Do(ctx, "slow", func(ctx context.Context) error {
			select {
			case <-time.After(6 * time.Second):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
	}()

	var (
		counter fencedCounter
		wg      sync.WaitGroup
		served  atomic.Int64
	)
	for _, l := range lockers {
		for range 8 {
			wg.Go(func() {
				for range 25 {
					err := l.Do(ctx, "hot", func(ctx context.Context) error {
						lease := flightlock.FromContext(ctx)
						counter.enter(lease.Fence(), lease.Fence(), 200*time.Microsecond)
						return nil
					})
					if err != nil {
						counter.fail("Do: %v", err)
						return
					}
					served.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if n := counter.check(t); n != 400 || served.Load() != 400 {
		t.Fatalf("%d sections, %d served, want 400", n, served.Load())
	}
	if err := <-long; err != nil {
		t.Fatalf("a lock held for three TTLs: %v", err)
	}
	cli := c.Client(t)
	waitFor(t, 5*time.Second, "every lock released", func() bool {
		resp, err := cli.Get(ctx, "lock:", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
	x, err := lockers[1].Lock(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockers[0].TryLock(ctx, "x"); !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("TryLock of a key another process holds: %v, want ErrBusy", err)
	}
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkLockerUncontended is BenchmarkUncontended for flightlock's Locker on the store:
// Lock + Release against the raw floor, alternating, with the ratio reported.
func BenchmarkLockerUncontended(b *testing.B) {
	c := etcdtest.Start(b)
	cli := c.Client(b)
	ctx := context.Background()
	s := newStore(b, cli)
	l, err := flightlock.New(s, flightlock.WithTTL(10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	lease, err := l.Lock(ctx, "warm")
	if err != nil {
		b.Fatal(err)
	}
	kv, err := cli.Get(ctx, "lock:warm")
	if err != nil || len(kv.Kvs) == 0 {
		b.Fatal(kv, err)
	}
	id := clientv3.LeaseID(kv.Kvs[0].Lease)
	_ = lease.Release(ctx)
	floorValue := newValue(ownerA, 11, "")
	var floor, locker time.Duration
	for b.Loop() {
		t0 := time.Now()
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("lock:floor"), "=", 0)).
			Then(clientv3.OpPut("lock:floor", floorValue, clientv3.WithLease(id))).Commit()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := cli.Delete(ctx, "lock:floor"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		lease, err := l.Lock(ctx, "k")
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		floor += t1.Sub(t0)
		locker += t2.Sub(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "floor-ns/op")
	b.ReportMetric(float64(locker.Nanoseconds())/n, "locker-ns/op")
	b.ReportMetric(float64(locker)/float64(floor), "locker/floor")
}

package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// fairLockers returns n fair Lockers, each on a store and client of its own (n processes).
func fairLockers(t *testing.T, c *etcdtest.Cluster, n int) []*flightlock.Locker {
	t.Helper()
	var out []*flightlock.Locker
	for range n {
		l, err := flightlock.New(newStore(t, c.Client(t)), flightlock.WithTTL(2*time.Second),
			flightlock.WithWait(20*time.Second), flightlock.WithFair())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Drain(context.Background()) })
		out = append(out, l)
	}
	return out
}

// lineLen counts the places in key's line.
func lineLen(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), lineDir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// Four processes, three waiters each, asking one after the other while the key is held: the
// key goes to them in the order their Locks began.
func TestFairLocksGrantInRequestOrderAcrossProcesses(t *testing.T) {
	c := etcdtest.Start(t)
	lockers := fairLockers(t, c, 4)
	cli := c.Client(t)
	ctx := bg(t)
	first, err := lockers[0].Lock(ctx, "ticket")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 12
	var (
		mu      sync.Mutex
		granted []int // guarded by mu: waiters in grant order
		wg      sync.WaitGroup
	)
	for i := range waiters {
		wg.Go(func() {
			lease, err := lockers[i%4].Lock(ctx, "ticket")
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			granted = append(granted, i)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
			if err := lease.Release(ctx); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
		// The line says when a waiter has asked: the next one starts only then, so that the
		// order of asking is the order of i on a loaded machine too.
		waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d in the line", i), func() bool {
			return lineLen(t, cli, "lock:ticket") == int64(i+1)
		})
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	want := make([]int, waiters)
	for i := range want {
		want[i] = i
	}
	if !slices.Equal(granted, want) {
		t.Fatalf("granted in order %v, asked in %v", granted, want)
	}
	if n := lineLen(t, cli, "lock:ticket"); n != 0 {
		t.Fatalf("%d places left in line", n)
	}
}

// A waiter that gives up (its context ends) leaves the line at once: the one behind it takes
// the key as soon as it is released, not a queue time later.
func TestFairWaiterThatGivesUpLeavesTheLine(t *testing.T) {
	c := etcdtest.Start(t)
	lockers := fairLockers(t, c, 3)
	cli := c.Client(t)
	ctx := bg(t)
	holder, err := lockers[0].Lock(ctx, "seat")
	if err != nil {
		t.Fatal(err)
	}
	quitter, quit := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	go func() {
		_, err := lockers[1].Lock(quitter, "seat")
		gaveUp <- err
	}()
	waitFor(t, 2*time.Second, "the first waiter in line", func() bool { return lineLen(t, cli, "lock:seat") == 1 })
	got := make(chan time.Time, 1)
	go func() {
		lease, err := lockers[2].Lock(ctx, "seat")
		if err != nil {
			t.Errorf("the second waiter: %v", err)
			got <- time.Time{}
			return
		}
		got <- time.Now()
		_ = lease.Release(ctx)
	}()
	waitFor(t, 2*time.Second, "the second waiter in line", func() bool { return lineLen(t, cli, "lock:seat") == 2 })
	quit()
	if err := <-gaveUp; !errors.Is(err, flightlock.ErrBusy) {
		t.Fatalf("the waiter that gave up: %v, want ErrBusy", err)
	}
	released := time.Now()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	at := <-got
	if at.IsZero() {
		return
	}
	if wait := at.Sub(released); wait > time.Second {
		t.Fatalf("the second waiter got the key %v after its release: the one that gave up still held the line", wait)
	}
}

// A waiter whose process died (a place taken with a fair Acquire and never asked for again)
// holds up the line for at most its queue time: its place's lease runs out and its deletion
// wakes the next in line.
func TestDeadFairWaiterBlocksTheLineAtMostItsQueueTime(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := bg(t)
	holder, dead := newStore(t, c.Client(t)), newStore(t, c.Client(t))
	const key = "lock:bed"
	if r, err := holder.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: 2 * time.Second}); err != nil || !r.Acquired {
		t.Fatalf("holder = %+v, %v", r, err)
	}
	r, err := dead.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: 2 * time.Second, Asked: time.Now(), Queue: flightlock.FairQueueTTL})
	if err != nil || r.Acquired {
		t.Fatalf("the dead waiter's place = %+v, %v; want busy", r, err)
	}
	lastAsked := time.Now()
	lockers := fairLockers(t, c, 1)
	got := make(chan error, 1)
	var at time.Time
	go func() {
		lease, err := lockers[0].Lock(ctx, "bed")
		at = time.Now()
		if err == nil {
			_ = lease.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, 2*time.Second, "the live waiter in line", func() bool { return lineLen(t, c.Client(t), key) == 2 })
	if _, err := holder.Release(ctx, key, ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the live waiter: %v", err)
	}
	blocked := at.Sub(lastAsked)
	t.Logf("the live waiter got the key %v after the dead one's last fair Acquire", blocked)
	// etcd expires a lease within about half a second of its TTL.
	if blocked < flightlock.FairQueueTTL-300*time.Millisecond || blocked > flightlock.FairQueueTTL+1200*time.Millisecond {
		t.Fatalf("a dead waiter ahead held the line %v, want about its queue time %v", blocked, flightlock.FairQueueTTL)
	}
}

// The store-level contract of a line: places in order of the first refused attempt, a free key
// refused with HolderTTL 0 to all but the first in line, TryLock (queue 0) refused while anyone
// is in line, the grant leaving the line, LeaveQueue waking the key's watchers.
func TestFairLineOnTheStore(t *testing.T) {
	_, cli := single(t)
	ctx := bg(t)
	s := newStore(t, cli)
	const key, ttl, queue = "lock:q", 2 * time.Second, 2 * time.Second
	ownerC, ownerD := "cccccccccccccccccccccccccccccccc", "dddddddddddddddddddddddddddddddd"
	if r, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerD, TTL: ttl, Meta: "host=x", Asked: time.Now(), Queue: queue}); err != nil || !r.Acquired {
		t.Fatalf("free key, empty line = %+v, %v", r, err)
	}
	if n := lineLen(t, cli, key); n != 0 {
		t.Fatalf("a grant took %d places", n)
	}
	for _, o := range []string{ownerA, ownerB, ownerC} {
		if r, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: o, TTL: ttl, Asked: time.Now(), Queue: queue}); err != nil || r.Acquired || r.HolderTTL != 3*time.Second {
			t.Fatalf("%s behind a holder = %+v, %v; want busy with the holder's TTL", o[:1], r, err)
		}
	}
	if n := lineLen(t, cli, key); n != 3 {
		t.Fatalf("%d places, want 3", n)
	}
	if _, err := s.Release(ctx, key, ownerD, "", 0); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{ownerB, ownerC} {
		if r, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: o, TTL: ttl, Asked: time.Now(), Queue: queue}); err != nil || r.Acquired || r.HolderTTL != 0 {
			t.Fatalf("%s behind the first in line = %+v, %v; want busy with HolderTTL 0", o[:1], r, err)
		}
	}
	if r, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerD, TTL: ttl, Asked: time.Now(), Queue: 0}); err != nil || r.Acquired || r.HolderTTL != 0 {
		t.Fatalf("TryLock with a line = %+v, %v; want busy with HolderTTL 0", r, err)
	}
	a, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: ttl, Asked: time.Now(), Queue: queue})
	if err != nil || !a.Acquired {
		t.Fatalf("the first in line = %+v, %v; want the key", a, err)
	}
	if n := lineLen(t, cli, key); n != 2 {
		t.Fatalf("%d places after a grant, want 2", n)
	}
	if _, err := s.Release(ctx, key, ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	watch, err := s.Watch(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if err := s.LeaveQueue(ctx, key, ownerB); err != nil {
		t.Fatal(err)
	}
	select {
	case <-watch.C():
	case <-time.After(2 * time.Second):
		t.Fatal("leaving the line did not wake the key's watchers")
	}
	if err := s.LeaveQueue(ctx, key, ownerB); err != nil {
		t.Fatalf("leaving a line one is not in: %v", err)
	}
	c, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerC, TTL: ttl, Asked: time.Now(), Queue: queue})
	if err != nil || !c.Acquired || c.Fence <= a.Fence {
		t.Fatalf("the next in line after one left = %+v, %v; want the key with a fence above %d", c, err, a.Fence)
	}
	if _, err := s.Release(ctx, key, ownerC, "", 0); err != nil {
		t.Fatal(err)
	}
	if n := lineLen(t, cli, key); n != 0 {
		t.Fatalf("%d places left", n)
	}
}

package zkstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
)

// At a short session (6 s, so a 1 s lock TTL with the ensemble's 500 ms tick and syncLimit 5),
// waiters queued on a key ride out the SIGKILL of the ensemble's leader: the election's errors
// and the replies that come too late to hold a lock are passing conditions of the store, retried
// within the wait, so each waiter gets the key once the holder is done (or its lock ran out),
// one at a time, while the ensemble runs on two of its three servers.
func TestWaitersRideOutALeaderKillAtAShortSession(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server ZooKeeper ensemble")
	}
	ens := zktest.StartEnsemble(t, 3)
	const session, ttl = 6 * time.Second, time.Second
	locker := func(opts ...flightlock.Option) *flightlock.Locker {
		s, err := Dial(Config{Hosts: ens.Addrs(), SessionTimeout: session, Root: "/flightlock-test", TickTime: 500 * time.Millisecond, SyncLimit: 5})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return mustLocker(t, s, append([]flightlock.Option{flightlock.WithTTL(ttl)}, opts...)...)
	}
	ctx := context.Background()
	for trial := range 2 {
		key := fmt.Sprintf("kill-%d", trial)
		holder := locker()
		held, err := holder.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var inside, overlaps atomic.Int32
		results := make(chan error, 2)
		for range 2 {
			w := locker(flightlock.WithWait(30 * time.Second))
			go func() {
				lease, err := w.Lock(ctx, key)
				if err == nil {
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					time.Sleep(100 * time.Millisecond)
					inside.Add(-1)
					_ = lease.Release(ctx)
				}
				results <- err
			}()
		}
		time.Sleep(500 * time.Millisecond) // the waiters have asked and wait for the holder
		leader := ens.Leader()
		leader.Stop()
		ens.WaitReady(30 * time.Second)
		_ = held.Release(ctx) // the holder may have lost its lock meanwhile: a 1 s TTL is shorter than some elections
		for i := range 2 {
			if err := <-results; err != nil {
				t.Fatalf("trial %d: waiter %d after the leader's kill: %v, want the key within its wait", trial, i+1, err)
			}
		}
		if n := overlaps.Load(); n != 0 {
			t.Fatalf("trial %d: %d waiters held the key at once", trial, n)
		}
		leader.Restart()
		ens.WaitReady(30 * time.Second)
	}
}

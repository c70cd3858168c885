package zkstore

import (
	"context"
	"fmt"
	"sync"
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
		return mustLocker(t, dialSession(t, session, ens.Addrs()...), append([]flightlock.Option{flightlock.WithTTL(ttl)}, opts...)...)
	}
	ctx := context.Background()
	for trial := range 2 {
		key := fmt.Sprintf("kill-%d", trial)
		holder := locker()
		held, err := holder.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var (
			inside   atomic.Pointer[flightlock.Lease] // the waiter that entered last, until it leaves
			overlaps atomic.Int32
		)
		results := make(chan error, 2)
		var asked sync.WaitGroup // until each waiter was refused once, or its Lock returned
		for range 2 {
			asked.Add(1)
			refused := sync.OnceFunc(asked.Done)
			w := locker(flightlock.WithWait(30*time.Second), flightlock.WithObserver(flightlock.Observer{
				Retry: func(context.Context, string, int, time.Duration) { refused() },
			}))
			go func() {
				lease, err := w.Lock(ctx, key)
				refused()
				if err == nil {
					// The other waiter still inside overlaps only if its lease is live: one
					// granted on a reply that came late (a 1 s TTL during an election) can be
					// told lost, and the key given on, before it leaves.
					if prev := inside.Swap(lease); prev != nil && prev.Context().Err() == nil {
						overlaps.Add(1)
					}
					time.Sleep(100 * time.Millisecond)
					inside.CompareAndSwap(lease, nil)
					_ = lease.Release(ctx)
				}
				results <- err
			}()
		}
		// The kill finds both waiters waiting for the holder, however slow their first ask.
		asked.Wait()
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
			t.Fatalf("trial %d: %d waiters held the key at once, both leases live", trial, n)
		}
		leader.Restart()
		ens.WaitReady(30 * time.Second)
	}
}

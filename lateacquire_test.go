package flightlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// lateStore answers the first Acquire busy and lets the second run past its call's deadline:
// that one lands in the store late, after its caller gave it back and tried again, and its
// store then gives back what it took for the caller that left (as the Redis store's late-reply
// hook and the ZooKeeper store's do), by owner.
type lateStore struct {
	lockstore.Store
	calls  atomic.Int64
	landed chan struct{}
}

func (s *lateStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta string) (lockstore.Acquisition, error) {
	switch s.calls.Add(1) {
	case 1:
		return lockstore.Acquisition{HolderTTL: time.Millisecond}, nil
	case 2:
		<-ctx.Done()
		go func() {
			defer close(s.landed)
			time.Sleep(50 * time.Millisecond) // the retry has its grant by now
			bg := context.Background()
			if res, err := s.Store.Acquire(bg, key, owner, ttl, meta); err == nil && res.Acquired {
				_, _ = s.Store.Release(bg, key, owner, "", 0)
			}
		}()
		return lockstore.Acquisition{}, ctx.Err()
	}
	return s.Store.Acquire(ctx, key, owner, ttl, meta)
}

// An attempt that timed out while the wait went on, and landed late, is given back by owner:
// the next attempt must not share its owner token, or that give-back releases the new grant
// under its holder (who would learn it only at its next renewal, with someone else inside).
func TestLateAttemptsGiveBackDoesNotReleaseTheRetrysGrant(t *testing.T) {
	s, _, _ := miniStore(t)
	ls := &lateStore{Store: s, landed: make(chan struct{})}
	const ttl = 300 * time.Millisecond
	l := mustLocker(t, ls, WithTTL(ttl), WithWait(10*time.Second))
	ctx := context.Background()
	lease, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	<-ls.landed
	if _, err := mustLocker(t, s, WithMode(Reject)).Lock(ctx, "k"); !errors.Is(err, ErrBusy) {
		t.Fatalf("another owner while the retry's grant is held: %v, want ErrBusy", err)
	}
}

// lateOnceStore answers its first acquisition too late to be held: the keeper's clock moves a
// whole TTL while the call is on its way, as during a store's leader election.
type lateOnceStore struct {
	*memStore
	clk   *manualClock
	ttl   time.Duration
	calls atomic.Int64
}

func (s *lateOnceStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta string) (lockstore.Acquisition, error) {
	if s.calls.Add(1) == 1 {
		s.clk.Advance(s.ttl)
	}
	return s.memStore.Acquire(ctx, key, owner, ttl, meta)
}

// A grant whose reply came too late to be held is a passing condition of the store (an
// election, a stall), not the end of a wait: a waiter gives it back and tries again within its
// budget, and gets the key, instead of failing with the late reply.
func TestWaiterRetriesAGrantThatCameTooLate(t *testing.T) {
	clk := newManualClock()
	const ttl = 3 * time.Second
	s := &lateOnceStore{memStore: newMemStore(), clk: clk, ttl: ttl}
	l := mustLocker(t, s, WithTTL(ttl), WithWait(10*time.Second), withClock(clk))
	lease, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatalf("a waiter whose first grant came too late: %v, want the key on a later attempt", err)
	}
	if n := s.calls.Load(); n < 2 {
		t.Fatalf("%d acquisitions, want the late one and another", n)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Reject mode has no budget to retry in: the late reply is its answer.
	s2 := &lateOnceStore{memStore: newMemStore(), clk: clk, ttl: ttl}
	r := mustLocker(t, s2, WithTTL(ttl), WithMode(Reject), withClock(clk))
	if _, err := r.Lock(context.Background(), "k"); !errors.Is(err, errLateReply) {
		t.Fatalf("TryLock whose grant came too late: %v, want the late reply", err)
	}
}

package flightlock

// Review 6 of 81be057/6de4ccd (fixed): the extra attempt that the Locker makes right after a
// fresh Watch (locker.go acquire, "continue") was counted as one of the retry strategy's
// attempts and skipped the wait between attempts, and it was made without looking at the
// gate's closing.
//
//   - TestCappedAttemptsStillWait: with a capped strategy (LimitRetry, the middleware's
//     Retry.Attempts), Attempts: 2 used to mean "one more attempt after a wait, woken by the
//     release"; with the bug the second attempt was the extra one, made a round trip after the first,
//     and the waiter answers busy at once although the key is released 100ms later, well
//     within its 2s wait.
//   - TestDrainWhileSubscribingAnswersErrClosed: a waiter that is between attempts when
//     Drain starts must answer ErrClosed (Locker.Drain's contract); with the bug the extra attempt after
//     the fresh watch went to the store anyway and takes the key during the drain.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

func TestCappedAttemptsStillWait(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	holder := mustLocker(t, s, WithTTL(5*time.Second))
	lease, err := holder.TryLock(ctx, "capped")
	if err != nil {
		t.Fatal(err)
	}
	// Another process: a Locker of its own (its own gate).
	waiter := mustLocker(t, s, WithTTL(5*time.Second), WithWait(2*time.Second),
		WithRetry(LimitRetry(LinearRetry(time.Second), 2)))
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = lease.Release(ctx)
	}()
	start := time.Now()
	got, err := waiter.Lock(ctx, "capped")
	if err != nil {
		t.Fatalf("Lock = %v after %v; the key was released 100ms in, within the 2s wait and the one "+
			"retry (Attempts 2) the strategy allows: the extra attempt after the fresh watch used it up",
			err, time.Since(start).Round(time.Millisecond))
	}
	_ = got.Release(ctx)
}

// drainGapStore starts a drain of l while the waiter subscribes, then frees the key.
type drainGapStore struct {
	*memStore
	key, other string
	l          *Locker
	drained    chan error
}

func (g *drainGapStore) Watch(context.Context, string) (*lockstore.Watch, error) {
	go func() { g.drained <- g.l.Drain(context.Background()) }()
	for !g.l.k.gate.closed.Load() {
		time.Sleep(time.Millisecond)
	}
	_, _ = g.memStore.Release(context.Background(), g.key, g.other, "", 0)
	return lockstore.NewFreshWatch(make(chan struct{}), func() {}), nil
}

func TestDrainWhileSubscribingAnswersErrClosed(t *testing.T) {
	ctx := context.Background()
	s := &drainGapStore{memStore: newMemStore(), key: "lock:drain", other: "someone-else", drained: make(chan error, 1)}
	if got, err := s.Acquire(ctx, s.key, s.other, time.Minute, ""); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, s, WithWait(2*time.Second), WithRetry(LinearRetry(10*time.Millisecond)))
	s.l = l
	lease, err := l.Lock(ctx, "drain")
	if err == nil {
		_ = lease.Release(ctx)
		<-s.drained
		t.Fatal("Lock took the key after Drain had started (the extra attempt after a fresh watch); want ErrClosed, " +
			"as a waiter between attempts is told")
	}
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Lock = %v, want ErrClosed", err)
	}
	<-s.drained
}

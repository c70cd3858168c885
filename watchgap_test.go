package flightlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// gapStore releases the other owner's lock while a waiter subscribes, and never notifies: the
// release came between the waiter's busy reply and its subscription, and was published to
// nobody (review 4, the Locker's part of the lost wake-up).
type gapStore struct {
	*memStore
	key, other string
}

func (g *gapStore) Watch(context.Context, string) (*lockstore.Watch, error) {
	_, _ = g.memStore.Release(context.Background(), g.key, g.other, "", 0)
	return lockstore.NewFreshWatch(make(chan struct{}), func() {}), nil
}

// A waiter that was refused, then subscribed afresh (Watch.Fresh), tries once more before it sleeps: a release in
// between would otherwise leave it asleep with the key free until its retry delay (here
// longer than its whole wait, so it answered busy for a free key).
func TestWaiterTriesAgainOnceItListens(t *testing.T) {
	ctx := context.Background()
	s := &gapStore{memStore: newMemStore(), key: "lock:gap", other: "someone-else"}
	if got, err := s.Acquire(ctx, s.key, s.other, time.Minute, ""); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	l := mustLocker(t, s, WithWait(500*time.Millisecond), WithRetry(LinearRetry(10*time.Second)))
	lease, err := l.Lock(ctx, "gap")
	if errors.Is(err, ErrBusy) {
		t.Fatalf("Lock = %v for a key released while the waiter subscribed, want the lock", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = lease.Release(ctx)
}

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

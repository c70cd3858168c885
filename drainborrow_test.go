package flightlock

import (
	"context"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// stallReenter is a store whose Reenter, once it has run, waits until the test lets its reply
// go: a re-entry whose reply is on its way back while the process drains.
type stallReenter struct {
	lockstore.Store
	ran     chan struct{}
	release chan struct{}
}

func (s *stallReenter) Reenter(ctx context.Context, key, owner, hold string, ttl time.Duration) (lockstore.Acquisition, error) {
	a, err := s.Store.Reenter(ctx, key, owner, hold, ttl)
	close(s.ran)
	<-s.release
	return a, err
}

// Drain returns only when the process holds no lock. A re-entry of another process's lock
// through a handed-over owner (a borrowed hold) that was taken in Redis when Drain looked is
// held by the process, but the gate only counted it once the reply came (addBorrowed then):
// Drain returns nil in between, and a process that exits then leaves the hold in Redis, which
// keeps the upstream's lock from its peers for a TTL after the upstream released it.
func TestDrainWaitsForABorrowedHoldOnTheWire(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	upstream := mustLocker(t, s)
	up, err := upstream.Lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Release(ctx)
	owner := up.Owner()

	st := &stallReenter{Store: s, ran: make(chan struct{}), release: make(chan struct{})}
	l := mustLocker(t, st)
	got := make(chan lockResult, 1)
	go func() {
		lease, err := l.Lock(withOwner(ctx, up.Key(), owner), "b")
		got <- lockResult{lease, err}
	}()
	<-st.ran // the hold is listed in Redis; its reply has not come back

	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	derr := l.Drain(dctx)
	cancel()
	close(st.release)
	r := <-got
	if r.err != nil {
		t.Fatalf("borrowed re-entry: %v", r.err)
	}
	if derr == nil {
		t.Errorf("Drain returned nil while the process held a re-entry of %q in Redis (value %q), granted %v",
			up.Key(), mustGet(mr, up.Key()), r.lease.Grant())
	}
	_ = r.lease.Release(ctx)
}

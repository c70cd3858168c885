package flightlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// Lease.Grant tells a Redis acquisition, a handoff and a re-entry apart.
func TestLeaseGrant(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	// A handoff window of an hour: the default 20 ms, counted from the acquisition, can pass on
	// a loaded machine before the waiter has queued, and the lock then goes by the store.
	l := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(DefaultHandoff, time.Hour))
	first, err := l.Lock(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if first.Grant() != GrantStore {
		t.Fatalf("first lock: grant %v, want redis", first.Grant())
	}
	in, err := l.Lock(first.Context(), "g")
	if err != nil {
		t.Fatal(err)
	}
	if in.Grant() != GrantReentry || in.Grant().String() != "reentry" {
		t.Fatalf("nested lock: grant %v, want reentry", in.Grant())
	}
	_ = in.Release(ctx)
	got := make(chan *Lease, 1)
	go func() {
		lease, err := l.Lock(ctx, "g")
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	waitFor(t, 2*time.Second, "a waiter", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:g"].queued() == 1
	})
	_ = first.Release(ctx)
	second := <-got
	if second == nil {
		t.FailNow()
	}
	defer second.Release(ctx)
	if second.Grant() != GrantHandoff {
		t.Fatalf("queued waiter: grant %v, want handoff", second.Grant())
	}
}

// The Observer hears every retry of a wait, every renewal with its outcome, and a loss once.
func TestObserver(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	var (
		mu       sync.Mutex
		retries  []int
		renewals []error
		lost     []string
	)
	obs := Observer{
		Retry: func(_ context.Context, key string, attempt int, holderTTL time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			if key != "lock:busy" || holderTTL <= 0 {
				t.Errorf("Retry(%q, %d, %v)", key, attempt, holderTTL)
			}
			retries = append(retries, attempt)
		},
		Renewed: func(key string, err error) {
			mu.Lock()
			defer mu.Unlock()
			renewals = append(renewals, err)
		},
		Lost: func(key string) {
			mu.Lock()
			defer mu.Unlock()
			lost = append(lost, key)
		},
	}

	other := mustLocker(t, s, WithTTL(time.Minute))
	held, err := other.Lock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waiter := mustLocker(t, s, WithWait(40*time.Millisecond), WithRetry(LinearRetry(5*time.Millisecond)), WithObserver(obs))
	if _, err := waiter.Lock(ctx, "busy"); !errors.Is(err, ErrBusy) {
		t.Fatalf("%v, want ErrBusy", err)
	}
	mu.Lock()
	if len(retries) < 2 || retries[0] != 1 || retries[1] != 2 {
		t.Fatalf("retries %v, want 1, 2, ...", retries)
	}
	mu.Unlock()

	clk := newManualClock()
	fs := &faultStore{Store: s}
	const ttl = 90 * time.Millisecond
	l := mustLocker(t, fs, WithTTL(ttl), WithObserver(obs), withClock(clk))
	lease, err := l.Lock(ctx, "renewed")
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(mr, 2*ttl/3, time.Millisecond) // two renewals
	refused := lockstore.ErrNotHeld
	fs.failRefresh.Store(&refused)
	clk.Step(mr, ttl/3, time.Millisecond) // refused: lost
	clk.Step(mr, ttl, time.Millisecond)   // nothing more
	mu.Lock()
	defer mu.Unlock()
	if len(renewals) != 3 || renewals[0] != nil || renewals[1] != nil || !errors.Is(renewals[2], ErrNotHeld) {
		t.Fatalf("renewals %v, want two successes then ErrNotHeld", renewals)
	}
	if len(lost) != 1 || lost[0] != "lock:renewed" {
		t.Fatalf("lost %v, want lock:renewed once", lost)
	}
	if context.Cause(lease.Context()) != ErrLost {
		t.Fatalf("cause %v, want ErrLost", context.Cause(lease.Context()))
	}
	_ = lease.Release(ctx)
}

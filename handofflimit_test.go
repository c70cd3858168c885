package flightlock

import (
	"errors"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// limitedStore is a store whose fences leave room for few handoffs (lockstore.HandoffLimiter).
type limitedStore struct {
	*memStore
	max int
}

func (s limitedStore) MaxHandoffs() int { return s.max }

var _ lockstore.HandoffLimiter = limitedStore{}

// A handoff bound above what the store's fences allow is refused by New and With: a holder that
// died after that many handoffs could see the next grant repeat one of its fences (issue 14).
func TestHandoffBoundMustFitTheStore(t *testing.T) {
	store := limitedStore{memStore: newMemStore(), max: 10}
	if _, err := New(store, WithHandoff(11, time.Second)); !errors.Is(err, ErrConfig) {
		t.Fatalf("New with 11 handoffs on a store that allows 10: err %v, want ErrConfig", err)
	}
	l, err := New(store, WithHandoff(10, time.Second))
	if err != nil {
		t.Fatalf("New with the store's own bound: %v", err)
	}
	if _, err := l.With(WithHandoff(64, time.Second)); !errors.Is(err, ErrConfig) {
		t.Fatalf("With raising the bound past the store's: err %v, want ErrConfig", err)
	}
	if _, err := New(store); !errors.Is(err, ErrConfig) {
		t.Fatalf("New with the default bound (%d) on a store that allows 10: err %v, want ErrConfig", DefaultHandoff, err)
	}
	if _, err := New(newMemStore(), WithHandoff(1<<30, time.Second)); err != nil {
		t.Fatalf("a store without a limit takes any bound: %v", err)
	}
}

// Fewer handoffs in a row than the TTL has microseconds: the next grant after a holder that
// died comes a TTL later at a fence of at least the server time in microseconds, which must
// stay above the fences the dead holder handed out (docs/guarantees.md, Fences). A TTL of a
// millisecond cannot have the default 1,024.
func TestHandoffBoundStaysBelowTheTTLInMicroseconds(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want int
	}{
		{time.Millisecond, 999},
		{500 * time.Microsecond, 499},
		{time.Microsecond, 0},
		{10 * time.Second, DefaultHandoff},
	} {
		l, err := New(newMemStore(), WithTTL(tc.ttl))
		if err != nil {
			t.Fatal(err)
		}
		if l.k.handoff != tc.want {
			t.Errorf("TTL %v: %d handoffs in a row, want %d", tc.ttl, l.k.handoff, tc.want)
		}
	}
}

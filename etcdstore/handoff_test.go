package etcdstore

import (
	"testing"

	"github.com/flightlock/flightlock/lockstore"
)

var _ lockstore.HandoffLimiter = (*Store)(nil)

// The bound the store gives the core must stay below what its fence derivation covers
// (2<<fenceShift fences beyond a grant, fence.go): a change of fenceShift or of MaxHandoffs
// that breaks it fails here.
func TestMaxHandoffsWithinTheFenceRoom(t *testing.T) {
	got := (&Store{}).MaxHandoffs()
	if got <= 0 || got >= 2<<fenceShift {
		t.Fatalf("MaxHandoffs = %d, want within (0, %d)", got, 2<<fenceShift)
	}
}

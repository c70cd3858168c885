package etcdstore

import (
	"testing"
)

// The bound the store gives the core must stay below what its fence derivation covers
// (2<<fenceShift fences beyond a grant): a change of fenceShift or of Capabilities
// that breaks it fails here.
func TestMaxHandoffsWithinTheFenceRoom(t *testing.T) {
	got := (&Store{}).Capabilities().MaxHandoffs
	if got <= 0 || got >= 2<<fenceShift {
		t.Fatalf("MaxHandoffs = %d, want within (0, %d)", got, 2<<fenceShift)
	}
}

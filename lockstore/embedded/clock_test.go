package embedded

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// A clock held up for a while does not take that while from a key set just before it moves:
// the key keeps its TTL but for one step at most.
func TestHeldUpClockTakesNoTimeAKeyDidNotLive(t *testing.T) {
	mr := miniredis.RunT(t)
	last := time.Now()
	mr.Set("lock", "owner")
	mr.SetTTL("lock", time.Second)
	advance(mr, last, last.Add(600*time.Millisecond)) // the ticker was held up for 600 ms
	if ttl := mr.TTL("lock"); ttl < time.Second-maxStep {
		t.Fatalf("a key set just before the clock moved has %v left of its 1s TTL", ttl)
	}
}

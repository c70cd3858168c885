package flightlock

import (
	"context"
	"sync"
	"testing"
	"time"
)

// slotsHeld counts the re-entry slots each goroutine is inside (enterForCall reads it): inside
// a slot the goroutine's count is set, a slot handed to a waiting goroutine moves to it, and
// once every re-entry is released the map is empty again (no growth per goroutine).
func TestSlotsHeldFollowsTheSlots(t *testing.T) {
	s, _, _ := miniStore(t)
	l := mustLocker(t, s, WithWait(5*time.Second))
	outer, err := l.Lock(context.Background(), "slots")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := goid()
			if insideSlot(g) {
				errs <- "inside a slot before any re-entry"
			}
			lease, err := l.Lock(outer.Context(), "slots") // queues behind the others
			if err != nil {
				errs <- err.Error()
				return
			}
			if !insideSlot(g) {
				errs <- "not counted inside the slot it was granted"
			}
			nested, err := l.Lock(lease.Context(), "slots-inner") // a lock of its own, no slot
			if err != nil {
				errs <- err.Error()
			} else {
				_ = nested.Release(context.Background())
			}
			time.Sleep(5 * time.Millisecond)
			_ = lease.Release(context.Background())
			if insideSlot(g) {
				errs <- "still counted inside after its re-entry was released"
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	_ = outer.Release(context.Background())
	slotsHeldMu.Lock()
	n := len(slotsHeld)
	slotsHeldMu.Unlock()
	if n != 0 {
		t.Fatalf("slotsHeld keeps %d goroutines after every re-entry was released", n)
	}
}

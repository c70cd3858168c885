package etcdstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
)

// Three processes (a store and a client each) share 3 permits of a key on etcd, 4 goroutines
// each: never more than 3 live holders at once, all 3 used, fences per permit rising.
func TestPermitsOnEtcdNeverExceedTheirCount(t *testing.T) {
	c := etcdtest.Start(t)
	const permits, goroutines, sections = 3, 4, 8
	var lockers []*flightlock.Locker
	for range 3 {
		l, err := flightlock.New(newStore(t, c.Client(t)), flightlock.WithTTL(2*time.Second),
			flightlock.WithWait(30*time.Second), flightlock.WithPermits(permits))
		if err != nil {
			t.Fatal(err)
		}
		lockers = append(lockers, l)
	}
	var inside, peak, ran atomic.Int64
	var mu sync.Mutex
	lastFence := map[string]int64{}
	var wg sync.WaitGroup
	for _, l := range lockers {
		for range goroutines {
			wg.Go(func() {
				for range sections {
					lease, err := l.Lock(context.Background(), "export")
					if err != nil {
						t.Errorf("Lock: %v", err)
						return
					}
					n := inside.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					mu.Lock()
					if f := lease.Fence(); f <= lastFence[lease.Key()] {
						t.Errorf("permit %s granted with fence %d after %d", lease.Key(), f, lastFence[lease.Key()])
					} else {
						lastFence[lease.Key()] = f
					}
					mu.Unlock()
					time.Sleep(5 * time.Millisecond)
					inside.Add(-1)
					ran.Add(1)
					if err := lease.Release(context.Background()); err != nil {
						t.Errorf("Release: %v", err)
					}
				}
			})
		}
	}
	wg.Wait()
	if most := peak.Load(); most > permits || most < 2 || ran.Load() != 3*goroutines*sections {
		t.Fatalf("%d holders at once at most (want 2..%d); %d sections ran", most, permits, ran.Load())
	}
	if len(lastFence) != permits {
		t.Errorf("permits used: %v, want all %d", lastFence, permits)
	}
}

package jobs

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Two instances of a service on one Redis tick the interest job every few milliseconds: the
// job runs again and again, never on both at once; and a shutdown that comes while a run is
// under way waits for it: the run finishes, then the Middleware's drain and the job's Stop
// return.
func TestInterestRunsOnOneInstanceAtATimeAndShutdownWaitsForIt(t *testing.T) {
	srv := redistest.Start(t)
	var inside, most, runs atomic.Int32
	var longDone atomic.Bool
	hold := make(chan struct{}) // closed: runs go on; open: the next run waits on it
	close(hold)
	var holdNext atomic.Pointer[chan struct{}]
	started := make(chan struct{}, 1)
	accrue := func(ctx context.Context) error {
		n := inside.Add(1)
		defer inside.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if h := holdNext.Swap(nil); h != nil {
			started <- struct{}{}
			<-*h // a long run: shutdown comes while it is under way
			time.Sleep(2 * time.Millisecond)
			longDone.Store(true)
		}
		time.Sleep(2 * time.Millisecond)
		runs.Add(1)
		return nil
	}

	var instances []*flmw.Middleware
	var jobs []*Interest
	for range 2 {
		m, err := flmw.New(flmw.LockConf{Redis: flmw.RedisConf{Host: srv.Addr}, Drain: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		j, err := NewInterest(m, 3*time.Millisecond, accrue)
		if err != nil {
			t.Fatal(err)
		}
		go j.Start()
		instances, jobs = append(instances, m), append(jobs, j)
	}
	deadline := time.Now().Add(10 * time.Second)
	for runs.Load() < 20 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if runs.Load() < 20 {
		t.Fatalf("the job ran %d times in 10s, want at least 20", runs.Load())
	}

	// The next run holds on; shutdown both instances while it does.
	long := make(chan struct{})
	holdNext.Store(&long)
	<-started
	stopped := make(chan struct{})
	go func() {
		for i, m := range instances {
			_ = m.Shutdown(context.Background())
			jobs[i].Stop()
		}
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("shutdown returned while a run was under way")
	case <-time.After(200 * time.Millisecond):
	}
	close(long)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown did not return after the run finished")
	}
	if !longDone.Load() {
		t.Error("shutdown returned before the run under way finished")
	}
	if most.Load() != 1 {
		t.Errorf("%d runs at once, want 1", most.Load())
	}
}

package flightlock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

// criticalSection is a read-sleep-write of a counter: without mutual exclusion, concurrent
// sections lose updates. inside counts holders at once; more than one is a violation.
func runSections(t *testing.T, l *Locker, goroutines, sections int, counter *int, violations *atomic.Int64) {
	t.Helper()
	var (
		inside atomic.Int64
		start  = make(chan struct{})
		wg     sync.WaitGroup
		errs   = make(chan error, goroutines)
	)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < sections; i++ {
				err := l.Do(context.Background(), "exclusion", func(context.Context) error {
					if inside.Add(1) != 1 {
						violations.Add(1)
					}
					v := *counter
					time.Sleep(50 * time.Microsecond)
					*counter = v + 1
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Do: %v", err)
	}
}

func TestMutualExclusionInProcess(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) lockstore.Store
	}{
		{"miniredis", func(t *testing.T) lockstore.Store { s, _, _ := miniStore(t); return s }},
		{"redis-server", func(t *testing.T) lockstore.Store { s, _, _ := realStore(t); return s }},
		{"redis-cluster", clusterStore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, handoff := range []int{0, DefaultHandoff} {
				l := mustLocker(t, tc.store(t), WithWait(30*time.Second), WithHandoff(handoff, time.Minute))
				var counter int
				var violations atomic.Int64
				const goroutines, sections = 64, 5
				runSections(t, l, goroutines, sections, &counter, &violations)
				if counter != goroutines*sections || violations.Load() != 0 {
					t.Fatalf("handoff %d: counter %d, want %d; %d overlapping holders",
						handoff, counter, goroutines*sections, violations.Load())
				}
				if n := l.gateLen(); n != 0 {
					t.Fatalf("gate keeps %d entries after all locks were released", n)
				}
			}
		})
	}
}

// The cross-process test re-executes the test binary as workers; each runs goroutines that
// do read-sleep-write sections on a counter in Redis under the lock.
const (
	workerEnv       = "FLIGHTLOCK_EXCLUSION_WORKER"
	workerAddrEnv   = "FLIGHTLOCK_EXCLUSION_ADDR"
	workerGoroutine = 16
	workerSections  = 5
)

func runExclusionWorker() int {
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(workerAddrEnv), DisableIdentity: true, ContextTimeoutEnabled: true})
	defer c.Close()
	store := redisstore.New(c)
	defer store.Close()
	l, err := New(store, WithWait(60*time.Second), WithTTL(5*time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var wg sync.WaitGroup
	var failed atomic.Bool
	for g := 0; g < workerGoroutine; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < workerSections; i++ {
				err := l.Do(context.Background(), "xproc", func(ctx context.Context) error {
					if n := c.Incr(ctx, "xproc:inside").Val(); n != 1 {
						c.Incr(ctx, "xproc:violations")
					}
					v, _ := c.Get(ctx, "xproc:counter").Int()
					time.Sleep(200 * time.Microsecond)
					c.Set(ctx, "xproc:counter", v+1, 0)
					c.Decr(ctx, "xproc:inside")
					return nil
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, "worker:", err)
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() {
		return 1
	}
	return 0
}

func TestMutualExclusionAcrossProcesses(t *testing.T) {
	_, srv, c := realStore(t)
	const processes = 4
	var wg sync.WaitGroup
	outs := make([][]byte, processes)
	errs := make([]error, processes)
	for p := 0; p < processes; p++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"=1", workerAddrEnv+"="+srv.Addr)
		childproc.Tie(cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[p], errs[p] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for p := range errs {
		if errs[p] != nil {
			t.Fatalf("worker %d: %v\n%s", p, errs[p], outs[p])
		}
	}
	ctx := context.Background()
	got, _ := c.Get(ctx, "xproc:counter").Int()
	violations, _ := c.Get(ctx, "xproc:violations").Int()
	if want := processes * workerGoroutine * workerSections; got != want || violations != 0 {
		t.Fatalf("counter %d, want %d; %d overlapping holders", got, want, violations)
	}
	if n, _ := c.Exists(ctx, "lock:xproc").Result(); n != 0 {
		t.Fatal("lock key left behind after every worker released")
	}
}

func TestRejectCostsNoRedisCommands(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, s lockstore.Store, commands func() int64, probeCost int64) {
		l := mustLocker(t, s, WithTTL(time.Minute), WithMode(Reject))
		lease, err := l.Lock(ctx, "hot")
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		before := commands()
		var wg sync.WaitGroup
		var busy atomic.Int64
		start := make(chan struct{})
		for g := 0; g < 100; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < 100; i++ {
					if _, err := l.TryLock(ctx, "hot"); errors.Is(err, ErrBusy) {
						busy.Add(1)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if busy.Load() != 10000 {
			t.Fatalf("%d of 10000 TryLocks were busy", busy.Load())
		}
		if d := commands() - before - probeCost; d != 0 {
			t.Fatalf("10000 rejected TryLocks cost %d Redis commands, want 0", d)
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		s, mr, _ := miniStore(t)
		check(t, s, func() int64 { return int64(mr.CommandCount()) }, 0)
	})
	t.Run("redis-server", func(t *testing.T) {
		s, srv, c := realStore(t)
		// INFO counts itself: measure the cost of the probe and subtract it.
		a := srv.CommandCount(ctx, c)
		probe := srv.CommandCount(ctx, c) - a
		check(t, s, func() int64 { return srv.CommandCount(ctx, c) }, probe)
	})
}

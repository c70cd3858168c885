package flightlock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

// faultSlack is how far past its caller's deadline a call may return through a fault: the
// scheduling of a loaded machine under -race, not a wait of the Locker's.
const faultSlack = 250 * time.Millisecond

// redisFault is one fault between the Lockers of a test and their redis-server.
type redisFault struct {
	name        string
	start, heal func()
	passable    bool // a call may get through between its faults (resets): it need not fail
}

// proxiedRedis starts a redis-server behind a fault proxy and returns a store whose only path
// to it is the proxy, a store straight to the server (another process's), and the faults.
func proxiedRedis(t *testing.T) (through, direct *redisstore.RedisStore, faults []redisFault) {
	t.Helper()
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr)
	opts := srv.Options()
	opts.Addr = p.Addr
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	through = redisstore.New(c, redisstore.WithWatchLinger(0))
	t.Cleanup(func() { _ = through.Close() })
	direct = redisstore.New(srv.Client(), redisstore.WithWatchLinger(0))
	t.Cleanup(func() { _ = direct.Close() })
	stop := make(chan struct{})
	resets := func() {
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
					p.Cut()
				}
			}
		}()
	}
	return through, direct, []redisFault{
		{"replies held back", func() { p.SetDelay(time.Hour) }, func() { p.SetDelay(0); p.Cut() }, false},
		{"black hole", func() { p.SetDelay(time.Hour); p.Stall(time.Hour) }, func() { p.SetDelay(0); p.Cut() }, false},
		{"connections reset", resets, func() { stop <- struct{}{} }, true},
		{"server down", srv.Stop, srv.Restart, false},
	}
}

// Lock and Release of a permit and of a read lock return by their caller's deadline whatever
// Redis does (replies held back, a black hole, connections reset, the server down), as a
// lock's do: the wait loop, the calls and the give-backs of every primitive are bounded by the
// caller's context, and what a call could not finish goes on in the background.
func TestPermitsAndReadsReturnByTheirDeadlineThroughFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	through, direct, faults := proxiedRedis(t)
	ctx := context.Background()
	const budget = 600 * time.Millisecond
	for _, kind := range []struct {
		name  string
		opts  []Option
		other func() (release func()) // holds the key elsewhere, so that a Lock has to wait
	}{
		{"lock", nil, nil},
		{"permits", []Option{WithPermits(3)}, nil},
		{"read", []Option{WithRead()}, nil},
		{"permits held elsewhere", []Option{WithPermits(2)}, func() func() {
			other := mustLocker(t, direct, WithPermits(2), WithTTL(2*time.Second))
			a, _ := other.Lock(ctx, "busy")
			b, _ := other.Lock(ctx, "busy")
			return func() { _ = a.Release(ctx); _ = b.Release(ctx) }
		}},
		{"read behind a writer elsewhere", []Option{WithRead()}, func() func() {
			w, _ := mustLocker(t, direct, WithTTL(2*time.Second)).Lock(ctx, "busy")
			return func() { _ = w.Release(ctx) }
		}},
	} {
		l := mustLocker(t, through, append([]Option{WithTTL(2 * time.Second), WithWait(20 * time.Second)}, kind.opts...)...)
		key := "k"
		if kind.other != nil {
			key = "busy"
		}
		for _, f := range faults {
			t.Run(fmt.Sprintf("%s/%s", kind.name, f.name), func(t *testing.T) {
				healthyLocker(t, l, "k")
				// Release: the lease was taken before the fault.
				var held *Lease
				if kind.other == nil {
					var err error
					if held, err = l.Lock(ctx, key); err != nil {
						t.Fatal(err)
					}
				} else {
					release := kind.other()
					defer release()
				}
				f.start()
				defer func() { f.heal(); healthyLocker(t, l, "k") }()
				if held != nil {
					rctx, cancel := context.WithTimeout(ctx, budget)
					deadline, _ := rctx.Deadline()
					err := held.Release(rctx)
					cancel()
					if over := time.Since(deadline); over > faultSlack {
						t.Errorf("Release returned %v past its deadline (%v)", over, err)
					}
				}
				for i := range 2 {
					lctx, cancel := context.WithTimeout(ctx, budget)
					deadline, _ := lctx.Deadline()
					lease, err := l.Lock(lctx, key)
					cancel()
					if over := time.Since(deadline); over > faultSlack {
						t.Errorf("Lock #%d returned %v past its deadline (%v)", i+1, over, err)
					}
					if err == nil {
						if !f.passable {
							t.Errorf("Lock #%d succeeded through the fault", i+1)
						}
						_ = lease.Release(ctx)
					} else if errors.Is(err, ErrInvalidKey) {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// healthyLocker waits until l takes and releases key, failing t after 20s.
func healthyLocker(t *testing.T, l *Locker, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		lease, err := l.Lock(ctx, key)
		if err == nil {
			_ = lease.Release(ctx)
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no lock once the fault healed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package flightlock_test

// Benchmarks of the library's hot paths. They run on a real redis-server started on
// a free loopback port when one is installed, and on the embedded miniredis otherwise; set
// FLIGHTLOCK_BENCH_STORE=embedded to force miniredis. The side-by-side comparison with other
// lock libraries lives in the bench/ module (bench/run.sh).
//
//	go test -run '^$' -bench . -benchmem

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

// benchStore returns a store for b and a function that counts the commands the server has
// processed so far (nil on miniredis, which does not count them).
func benchStore(b *testing.B, opts ...redisstore.Option) (*redisstore.RedisStore, func() int64) {
	b.Helper()
	if _, err := exec.LookPath("redis-server"); err == nil && os.Getenv("FLIGHTLOCK_BENCH_STORE") != "embedded" {
		srv := redistest.Start(b)
		client := srv.Client()
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true, PoolSize: 1})
		store := redisstore.New(client, opts...)
		b.Cleanup(func() {
			_ = store.Close()
			_ = admin.Close()
		})
		if err := store.Preload(context.Background()); err != nil {
			b.Fatal(err)
		}
		// Each count costs the INFO command that reads it: subtract it.
		return store, func() int64 { return srv.CommandCount(context.Background(), admin) }
	}
	store, err := embedded.New(opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	return store, nil
}

func benchLocker(b *testing.B, store lockstore.Store, opts ...flightlock.Option) *flightlock.Locker {
	b.Helper()
	l, err := flightlock.New(store, opts...)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// countCommands starts counting server commands and returns the function that adds the
// "cmds/op" metric when the timed loop is done, not counting the INFO commands of the
// measurement. It does nothing on miniredis (count is nil).
func countCommands(b *testing.B, count func() int64) (report func()) {
	if count == nil {
		return func() {}
	}
	before := count()
	return func() {
		after := count() - 1 // the INFO that read "after" was not counted yet; the one for before was
		b.ReportMetric(float64(after-before)/float64(b.N), "cmds/op")
	}
}

// BenchmarkLockRelease is an uncontended Lock + Release in wait mode (the default), cycling
// over keys that are free: two round trips (acquire and release scripts) per op.
func BenchmarkLockRelease(b *testing.B) {
	store, count := benchStore(b)
	l := benchLocker(b, store)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "bench:uncontended:" + strconv.Itoa(i)
	}
	ctx := context.Background()
	report := countCommands(b, count)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		lease, err := l.Lock(ctx, keys[i%len(keys)])
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	report()
}

// BenchmarkTryLockHeld is a reject-mode TryLock of a key that another goroutine of this
// process holds: it must fail with ErrBusy without any Redis command.
func BenchmarkTryLockHeld(b *testing.B) {
	store, count := benchStore(b)
	l := benchLocker(b, store, flightlock.WithMode(flightlock.Reject))
	ctx := context.Background()
	held, err := l.Lock(ctx, "bench:held")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = held.Release(ctx) }()
	report := countCommands(b, count)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := l.TryLock(ctx, "bench:held"); !errors.Is(err, flightlock.ErrBusy) {
			b.Fatalf("TryLock of a held key: %v", err)
		}
	}
	b.StopTimer()
	report()
}

// BenchmarkTryLockHeldParallel is BenchmarkTryLockHeld from GOMAXPROCS goroutines at once.
func BenchmarkTryLockHeldParallel(b *testing.B) {
	store, _ := benchStore(b)
	l := benchLocker(b, store, flightlock.WithMode(flightlock.Reject))
	ctx := context.Background()
	held, err := l.Lock(ctx, "bench:held")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = held.Release(ctx) }()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.TryLock(ctx, "bench:held"); !errors.Is(err, flightlock.ErrBusy) {
				b.Errorf("TryLock of a held key: %v", err)
				return
			}
		}
	})
}

// BenchmarkContendedHandoff is 64 goroutines taking one key in wait mode: most acquisitions
// are handoffs from the previous local holder, without a Redis round trip. The cmds/op metric
// shows how rarely Redis is involved.
func BenchmarkContendedHandoff(b *testing.B) {
	store, count := benchStore(b)
	l := benchLocker(b, store)
	ctx := context.Background()
	var (
		mu      sync.Mutex
		counter int
	)
	report := countCommands(b, count)
	b.ReportAllocs()
	b.SetParallelism(64 / max(1, runtimeProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			lease, err := l.Lock(ctx, "bench:contended")
			if err != nil {
				b.Errorf("Lock: %v", err)
				return
			}
			mu.Lock() // never contended while the lock works; the race detector checks it too
			counter++
			mu.Unlock()
			if err := lease.Release(ctx); err != nil {
				b.Errorf("Release: %v", err)
				return
			}
		}
	})
	b.StopTimer()
	report()
}

// BenchmarkManyKeysParallel is 64 goroutines locking keys drawn from 1,000 (bench scenario 4):
// no contention to speak of, so every Lock and Release is a Redis call. "batched" is the
// store's default, where calls beyond its 4 lanes share pipelines; "unbatched" sends each call
// on a pooled connection of its own (WithLanes(0)). cmds/op counts server commands, including
// those the scripts run.
func BenchmarkManyKeysParallel(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []redisstore.Option
	}{
		{"batched", nil},
		{"unbatched", []redisstore.Option{redisstore.WithLanes(0)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			store, count := benchStore(b, bc.opts...)
			l := benchLocker(b, store)
			keys := make([]string, 1000)
			for i := range keys {
				keys[i] = "bench:many:" + strconv.Itoa(i)
			}
			ctx := context.Background()
			var next atomic.Int64
			report := countCommands(b, count)
			b.ReportAllocs()
			b.SetParallelism(64 / max(1, runtimeProcs()))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					// A stride through the keys: neighbours in time rarely share one.
					key := keys[int(next.Add(7919)%int64(len(keys)))]
					lease, err := l.Lock(ctx, key)
					if err != nil {
						b.Errorf("Lock: %v", err)
						return
					}
					if err := lease.Release(ctx); err != nil {
						b.Errorf("Release: %v", err)
						return
					}
				}
			})
			b.StopTimer()
			report()
		})
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

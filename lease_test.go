package flightlock

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

// Release returns by its context's deadline whatever Redis does: frozen (SIGSTOP, connections
// open and silent) or stopped and restarted behind a client that keeps retrying. What it could
// not finish goes on in the background, bounded by one TTL: once the frozen server resumes the
// key is deleted, long before its TTL, and the Locker takes it again.
func TestReleaseReturnsByItsContextDeadlineWhateverRedisDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("stops a redis-server for seconds")
	}
	const (
		ttl      = 20 * time.Second
		deadline = time.Second
		// Generous for a loaded machine, and still below the fault: the frozen server stays
		// frozen for 5 s unless the test resumes it, the stopped one comes back after 3.5 s.
		within = deadline + 1500*time.Millisecond
	)
	for _, tc := range []struct {
		name  string
		fault func(t *testing.T, srv *redistest.Server) (end func()) // end returns once Redis answers again
	}{
		{"frozen", func(t *testing.T, srv *redistest.Server) func() {
			pid := srv.Pid()
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			resumed := make(chan struct{})
			t.Cleanup(func() { <-resumed })
			timer := time.AfterFunc(5*time.Second, func() { _ = syscall.Kill(pid, syscall.SIGCONT); close(resumed) })
			return func() {
				if timer.Stop() {
					_ = syscall.Kill(pid, syscall.SIGCONT)
					close(resumed)
				}
				<-resumed
			}
		}},
		{"restarting", func(t *testing.T, srv *redistest.Server) func() {
			srv.Stop()
			back := make(chan struct{})
			go func() {
				defer close(back)
				time.Sleep(3500 * time.Millisecond)
				srv.Restart()
			}()
			t.Cleanup(func() { <-back })
			return func() { <-back }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			opts := srv.Options()
			// A client that retries failed commands for longer than the outage lasts: the
			// store's release is then answered only once Redis is back.
			opts.MaxRetries, opts.MinRetryBackoff, opts.MaxRetryBackoff = 1000, 20*time.Millisecond, 50*time.Millisecond
			client := redis.NewClient(opts)
			s := redisstore.New(client, redisstore.WithOnClose(client.Close))
			t.Cleanup(func() { _ = s.Close() })
			l, err := New(s, WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			lease, err := l.Lock(context.Background(), "k")
			if err != nil {
				t.Fatal(err)
			}

			end := tc.fault(t, srv)
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			err = lease.Release(ctx)
			took := time.Since(start)
			if took > within {
				t.Fatalf("Release with a %v context returned after %v (%v)", deadline, took, err)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Release cut short by its deadline returned %v, want an error wrapping context.DeadlineExceeded", err)
			}

			end()
			// The release goes on once Redis answers (a restarted server lost the key anyway):
			// the key is free again well before its TTL.
			again, err := l.Lock(boundedContext(t, ttl/2), "k")
			if err != nil {
				t.Fatalf("the key is not free %v after the fault ended: %v", ttl/2, err)
			}
			if err := again.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A Release whose context has already ended still frees the key: returning by the deadline
// leaves the release to the background, never undone.
func TestReleaseWithAnEndedContextStillFreesTheKey(t *testing.T) {
	srv := redistest.Start(t)
	s := redisstore.New(srv.Client())
	t.Cleanup(func() { _ = s.Close() })
	const ttl = 20 * time.Second
	l, err := New(s, WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_ = lease.Release(ended) // nil, or the context's error when it did not wait
	check := srv.Client()
	deadline := time.Now().Add(ttl / 2)
	for check.Exists(context.Background(), "lock:k").Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the key is still held %v after a Release with an ended context", ttl/2)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// boundedContext is a context that ends after d or with the test.
func boundedContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A lock lost after the request's own context ended is still reported as lost: the lease's
// context keeps the request's Canceled as its cause, so the loss is read from the lease (Lost),
// and Do answers ErrLost.
func TestLossAfterTheRequestEndedIsStillReported(t *testing.T) {
	ms, mr, _ := miniStore(t)
	const ttl = 300 * time.Millisecond
	clk := newManualClock()
	fs := &faultStore{Store: ms}
	l := mustLocker(t, fs, WithTTL(ttl), withClock(clk))
	req, cancel := context.WithCancel(context.Background())
	err := l.Do(req, "gone", func(ctx context.Context) error {
		cancel() // the client went away; the handler goes on
		<-ctx.Done()
		refused := lockstore.ErrNotHeld
		fs.failRefresh.Store(&refused)
		clk.Step(mr, ttl/3, time.Millisecond)
		if !FromContext(ctx).Lost() {
			t.Errorf("Lost after the renewal was refused: false (context cause %v)", context.Cause(ctx))
		}
		return nil
	})
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Do whose lock was lost after its caller's context ended: %v, want ErrLost", err)
	}
}

// dropProxy forwards TCP to addr; when armed, it drops the next reply from the server and
// closes that client connection (a connection reset after Redis ran the command).
type dropProxy struct {
	ln    net.Listener
	armed atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newDropProxy(t *testing.T, addr string) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				defer p.wg.Done()
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if err != nil {
						return
					}
					if p.armed.CompareAndSwap(true, false) {
						s.Close() // the command ran; its reply never arrives
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Process A holds k and hands its owner to service B (zrpc metadata). B's borrowed hold is
// released, Redis runs release.lua (holds 2 -> 1), the connection drops before the reply, and
// go-redis (default MaxRetries 3, as middleware.NewStore builds it) sends release.lua again: holds
// 1 -> 0, the key is deleted while A still holds it. Process C then takes it.
func TestRetriedReleaseKeepsTheCallersLock(t *testing.T) {
	mr, p, sA, sB := dropStores(t)
	ctx := context.Background()
	a := mustLocker(t, sA)
	b := mustLocker(t, sB)
	c := mustLocker(t, sA, WithMode(Reject))

	if err := sA.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	la, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer la.Release(ctx)
	lb, err := b.Lock(withOwner(ctx, la.Key(), la.Owner()), "k")
	if err != nil {
		t.Fatal(err)
	}
	if lb.kind != GrantBorrowed {
		t.Fatalf("kind %v", lb.kind)
	}
	t.Logf("before B's release: %q", mustGet(mr, "lock:k"))
	p.armed.Store(true)
	err = lb.Release(ctx)
	t.Logf("B's release: %v; key now %q", err, mustGet(mr, "lock:k"))
	if la.Context().Err() != nil {
		t.Fatal("A was told")
	}
	lc, err := c.Lock(ctx, "k")
	if err == nil {
		t.Errorf("C took k while A still holds it (A's context live: %v); fences A %d C %d", la.Context().Err() == nil, la.Fence(), lc.Fence())
		_ = lc.Release(ctx)
	}
}

// dropStores returns a miniredis, a store on it (A's), and a store on it through a dropProxy
// (B's), closed when t ends.
func dropStores(t *testing.T) (*miniredis.Miniredis, *dropProxy, *redisstore.RedisStore, *redisstore.RedisStore) {
	t.Helper()
	mr := miniredis.RunT(t)
	direct := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	p := newDropProxy(t, mr.Addr())
	viaProxy := redis.NewClient(&redis.Options{Addr: p.ln.Addr().String(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	sA := redisstore.New(direct, redisstore.WithWatchLinger(0))
	sB := redisstore.New(viaProxy, redisstore.WithWatchLinger(0))
	t.Cleanup(func() { sA.Close(); sB.Close(); direct.Close(); viaProxy.Close() })
	return mr, p, sA, sB
}

func mustGet(mr *miniredis.Miniredis, k string) string {
	v, _ := mr.Get(k)
	return v
}

// The same retry on reenter.lua counts two holds for one lease: after A and B both released,
// the key stays held, by nobody, until its TTL.
func TestRetriedReenterListsOneHold(t *testing.T) {
	mr, p, sA, sB := dropStores(t)
	ctx := context.Background()
	if err := sA.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	a := mustLocker(t, sA)
	b := mustLocker(t, sB)
	c := mustLocker(t, sA, WithMode(Reject))
	la, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := sB.Client().(*redis.Client).Ping(ctx).Err(); err != nil { // a connection through the proxy, before it is armed
		t.Fatal(err)
	}
	p.armed.Store(true)
	lb, err := b.Lock(withOwner(ctx, la.Key(), la.Owner()), "k")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after B's re-entry: %q", mustGet(mr, "lock:k"))
	_ = lb.Release(ctx)
	_ = la.Release(ctx)
	if _, err := c.Lock(ctx, "k"); err != nil {
		t.Errorf("everyone released, yet: %v; key %q, TTL %v", err, mustGet(mr, "lock:k"), mr.TTL("lock:k"))
	}
}

// A lease that is never released (a forgotten Release on an error path): Redis frees the key
// after MaxHold + TTL, other processes take it, but this process's gate slot stays taken.
func TestLeakedLeaseDoesNotBlockTheKeyForever(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	clk := newManualClock()
	l := mustLocker(t, s, WithTTL(100*time.Millisecond), WithMaxHold(50*time.Millisecond), WithWait(50*time.Millisecond), withClock(clk))
	leaked, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(mr, 400*time.Millisecond, 5*time.Millisecond)
	t.Logf("leaked lease context: %v", context.Cause(leaked.Context()))
	other := mustLocker(t, s)
	if lo, err := other.Lock(ctx, "k"); err != nil {
		t.Fatalf("another process: %v", err)
	} else {
		_ = lo.Release(ctx)
	}
	if _, err := l.Lock(ctx, "k"); err != nil {
		t.Errorf("this process, after the key expired and was taken and freed elsewhere: %v", err)
	}
	_ = leaked.Release(ctx) // let goleak pass
}

// A Release that hands the lock to a goroutine of this process waiting for the key calls no
// store, so it has ended by the time it returns, whatever its context: it reports success even
// on a context that has already ended, and the waiter holds the key. (Run on its own goroutine
// and raced against the context's end, the handoff could be reported as ErrReleasePending
// although it had happened; that goroutine was also the hot key's largest cost.)
func TestReleaseHandingToALocalWaiterSucceedsOnAnEndedContext(t *testing.T) {
	// A window that a loaded machine cannot outlast: each release is a handoff.
	l := mustLocker(t, newMemStore(), WithHandoff(DefaultHandoff, time.Hour))
	for i := range 200 {
		held, err := l.Lock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *Lease, 1)
		go func() {
			lease, err := l.Lock(context.Background(), "k")
			if err != nil {
				t.Error(err)
			}
			got <- lease
		}()
		waitFor(t, 5*time.Second, "the second Lock queued in the gate", func() bool {
			l.k.gate.mu.Lock()
			defer l.k.gate.mu.Unlock()
			e := l.k.gate.entries["lock:k"]
			return e != nil && e.queued() == 1
		})
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		if err := held.Release(ended); err != nil {
			t.Fatalf("round %d: a release handed to a local waiter on an ended context: %v, want nil", i, err)
		}
		next := <-got
		if next == nil {
			t.FailNow()
		}
		if next.Fence() <= held.Fence() {
			t.Fatalf("round %d: the waiter's fence %d is not above the releaser's %d", i, next.Fence(), held.Fence())
		}
		if err := next.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

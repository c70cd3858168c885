package flightlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

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

// A lease makes its context only when Context is first called (a lease held without
// it costs no cancelable context). Whatever ended the lease before that call (loss, release,
// drain, the caller's context) ends the context it then gets, with the same cause.
func TestLeaseContextMadeLateCarriesItsEnd(t *testing.T) {
	ctx := context.Background()
	const ttl = 300 * time.Millisecond

	t.Run("lost", func(t *testing.T) {
		clk := newManualClock()
		fs := &faultStore{Store: newMemStore()}
		l := mustLocker(t, fs, WithTTL(ttl), withClock(clk))
		lease, err := l.Lock(ctx, "late:lost")
		if err != nil {
			t.Fatal(err)
		}
		refused := lockstore.ErrNotHeld
		fs.failRefresh.Store(&refused)
		clk.Advance(ttl / 3)
		if cause := context.Cause(lease.Context()); cause != ErrLost {
			t.Fatalf("context asked for after the loss: cause %v, want ErrLost", cause)
		}
		_ = lease.Release(ctx)
	})

	t.Run("released", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		lease, err := l.Lock(ctx, "late:released")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := lease.Context().Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("context asked for after release: %v, want context.Canceled", err)
		}
	})

	t.Run("drained", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		lease, err := l.Lock(ctx, "late:drained")
		if err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := l.Drain(dctx); err == nil {
			t.Fatal("drain with a lock held and an ended context reported nothing left")
		}
		if cause := context.Cause(lease.Context()); cause != ErrClosed {
			t.Fatalf("context asked for after drain interrupted the lease: cause %v, want ErrClosed", cause)
		}
		_ = lease.Release(ctx)
	})

	t.Run("parent", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		pctx, cancel := context.WithCancelCause(ctx)
		lease, err := l.Lock(pctx, "late:parent")
		if err != nil {
			t.Fatal(err)
		}
		stop := errors.New("caller gave up")
		cancel(stop)
		if cause := context.Cause(lease.Context()); cause != stop {
			t.Fatalf("context asked for after its parent ended: cause %v, want the parent's", cause)
		}
		if FromContext(lease.Context()) != lease {
			t.Fatal("the late context does not carry its lease")
		}
		_ = lease.Release(ctx)
	})

	// The first end wins, as with a context made by Lock: the lease's own end before its
	// parent's, the parent's before the lease's.
	t.Run("order", func(t *testing.T) {
		l := mustLocker(t, newMemStore())
		stop := errors.New("caller gave up")

		pctx, cancel := context.WithCancelCause(ctx)
		first, err := l.Lock(pctx, "late:order:1")
		if err != nil {
			t.Fatal(err)
		}
		_ = first.Release(ctx)
		cancel(stop)
		if cause := context.Cause(first.Context()); cause != context.Canceled {
			t.Fatalf("released, then the parent ended: cause %v, want context.Canceled", cause)
		}

		pctx, cancel = context.WithCancelCause(ctx)
		second, err := l.Lock(pctx, "late:order:2")
		if err != nil {
			t.Fatal(err)
		}
		cancel(stop)
		_ = second.Release(ctx)
		if cause := context.Cause(second.Context()); cause != stop {
			t.Fatalf("the parent ended, then released: cause %v, want the parent's", cause)
		}
	})

	// Goroutines asking for the context while the lease is lost all get the one context,
	// ended with ErrLost (run with -race).
	t.Run("concurrent", func(t *testing.T) {
		clk := asyncClock{newManualClock()}
		fs := &faultStore{Store: newMemStore()}
		l := mustLocker(t, fs, WithTTL(ttl), withClock(clk))
		lease, err := l.Lock(ctx, "late:concurrent")
		if err != nil {
			t.Fatal(err)
		}
		refused := lockstore.ErrNotHeld
		fs.failRefresh.Store(&refused)
		var wg sync.WaitGroup
		got := make([]context.Context, 8)
		for i := range got {
			wg.Go(func() { got[i] = lease.Context() })
		}
		clk.Advance(ttl / 3)
		wg.Wait()
		waitFor(t, 5*time.Second, "the refused renewal to lose the lease", func() bool {
			return context.Cause(lease.Context()) == ErrLost
		})
		for _, c := range got {
			if c != lease.Context() {
				t.Fatal("two contexts for one lease")
			}
		}
		_ = lease.Release(ctx)
	})
}

// A hold keeps its first lease inline and the others in its rare part (memory per held lock):
// adding and removing in any order must keep exactly the leases added and not removed, since a
// lease missing from it is never told ErrLost, and a lease left in it is ended twice. The rare
// part made for a second lease keeps the hold's owner token as it was.
func TestHoldLeasesKeepWhatWasAddedAndNotRemoved(t *testing.T) {
	leases := make([]*Lease, 5)
	for i := range leases {
		leases[i] = &Lease{fence: int64(i)}
	}
	contents := func(h *hold) []int64 {
		var out []int64
		if h.first != nil {
			out = append(out, h.first.fence)
		}
		if e := h.ext.Load(); e != nil {
			for _, x := range e.more {
				out = append(out, x.fence)
			}
		}
		slices.Sort(out)
		return out
	}
	minted, foreign := newOwnerToken(), "an-owner-token-of-another-process"
	for _, tc := range []struct {
		name   string
		add    []int
		remove []int
		want   []int64
	}{
		{"one", []int{0}, nil, []int64{0}},
		{"one removed", []int{0}, []int{0}, nil},
		{"first removed, a later one moves up", []int{0, 1, 2}, []int{0}, []int64{1, 2}},
		{"a later one removed", []int{0, 1, 2}, []int{1}, []int64{0, 2}},
		{"all removed, then added again", []int{0, 1, 2}, []int{2, 0, 1}, nil},
		{"removing one not there changes nothing", []int{0, 1}, []int{3}, []int64{0, 1}},
		{"removed twice", []int{0, 1, 2, 3, 4}, []int{3, 3, 0}, []int64{1, 2, 4}},
	} {
		for _, owner := range []string{minted, foreign} {
			t.Run(tc.name, func(t *testing.T) {
				h := &hold{}
				h.setOwner(owner, "")
				for _, i := range tc.add {
					h.addLeaseLocked(leases[i])
				}
				for _, i := range tc.remove {
					h.removeLeaseLocked(leases[i])
				}
				if got := contents(h); !slices.Equal(got, tc.want) {
					t.Errorf("hold keeps leases of fences %v, want %v", got, tc.want)
				}
				h.addLeaseLocked(leases[4])
				if got := contents(h); !slices.Contains(got, 4) || len(got) != len(tc.want)+1 {
					t.Errorf("after one more add the hold keeps %v, want %v and 4", got, tc.want)
				}
				if h.owner() != owner {
					t.Errorf("owner token %q after the leases changed, want %q", h.owner(), owner)
				}
			})
		}
	}
}

// swapCtx is a context whose values change over time, as pooled framework contexts do (gin's
// Context with ContextWithFallback reads c.Request.Context(), and gin reuses a Context for the
// next request once the handler returned).
type swapCtx struct {
	mu    sync.Mutex
	inner context.Context
}

func (s *swapCtx) get() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inner
}
func (s *swapCtx) set(c context.Context) {
	s.mu.Lock()
	s.inner = c
	s.mu.Unlock()
}
func (s *swapCtx) Deadline() (time.Time, bool) { return s.get().Deadline() }
func (s *swapCtx) Done() <-chan struct{}       { return s.get().Done() }
func (s *swapCtx) Err() error                  { return s.get().Err() }
func (s *swapCtx) Value(k any) any             { return s.get().Value(k) }

// The outer lease of a lease is the one its parent context held when Lock was called, not
// whatever the parent context holds when the chain is walked: after a pooled context moved on
// to a request that holds B, work left over from the first request must wait for B, not
// re-enter the other request's lease (a walk that looked the outer lease up again through the
// reused context would put two holders inside B, the re-entry with B's fence).
func TestOuterLeaseIsTheOneHeldAtLock(t *testing.T) {
	bg := context.Background()
	l := mustLocker(t, newMemStore())
	sc := &swapCtx{inner: bg}
	a, err := l.Lock(sc, "swap:A") // request 1, in the pooled context
	if err != nil {
		t.Fatal(err)
	}
	leftover := context.WithoutCancel(a.Context()) // request 1's background work
	_ = a.Release(bg)
	b, err := l.Lock(bg, "swap:B") // request 2
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(bg)
	sc.set(b.Context()) // the pooled context serves request 2 now

	ctx, cancel := context.WithTimeout(leftover, 100*time.Millisecond)
	defer cancel()
	if x, err := l.Lock(ctx, "swap:B"); err == nil {
		defer x.Release(bg)
		t.Fatalf("request 1's work got B while request 2 holds it: grant %v, fence %d (B's %d)", x.Grant(), x.Fence(), b.Fence())
	}
}

// The gate counts a run of handoffs in 16 bits: a larger WithHandoff bound counts as 65,535, so
// the count can never wrap around and hand a hot key on forever (which would also break the
// fence argument that bounds a run below the TTL's microseconds).
func TestHandoffRunIsBoundedBy16Bits(t *testing.T) {
	l := mustLocker(t, newMemStore(), WithHandoff(1<<30, time.Second), WithTTL(time.Hour))
	if l.k.handoff != maxHandoffRun {
		t.Fatalf("handoff bound %d, want %d (the gate's 16-bit count)", l.k.handoff, maxHandoffRun)
	}
	l = mustLocker(t, newMemStore(), WithHandoff(100, time.Second), WithTTL(time.Hour))
	if l.k.handoff != 100 {
		t.Fatalf("handoff bound %d, want the 100 asked for", l.k.handoff)
	}
}

// A lease finds the lease of the context it was locked in through that context (Lease.outer),
// before and after its own context is made, and AllFromContext lists the chain innermost first.
func TestOuterLeaseThroughTheParentContext(t *testing.T) {
	ctx := context.Background()
	l := mustLocker(t, newMemStore())
	a, err := l.Lock(ctx, "outer:a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	b, err := l.Lock(a.Context(), "outer:b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if got := b.outer; got != a {
		t.Fatalf("before b's context is made: outer %p, want a %p", got, a)
	}
	all := AllFromContext(b.Context())
	if len(all) != 2 || all[0] != b || all[1] != a {
		t.Fatalf("AllFromContext = %v, want [b a]", all)
	}
	if got := b.outer; got != a {
		t.Fatalf("after b's context is made: outer %p, want a %p", got, a)
	}
	if a.outer != nil {
		t.Fatal("a was locked in a context without a lease, yet has an outer lease")
	}
}

// A lease's context prints its key, not the lease's fields (which its locks guard): printing it
// while the lease is released from another goroutine is no data race (go test -race).
func TestLeaseContextPrintsItsKey(t *testing.T) {
	ctx := context.Background()
	l := mustLocker(t, newMemStore())
	x, err := l.Lock(ctx, "print:me")
	if err != nil {
		t.Fatal(err)
	}
	lctx := x.Context()
	var wg sync.WaitGroup
	wg.Go(func() { _ = x.Release(ctx) })
	s := fmt.Sprint(lctx)
	wg.Wait()
	if !strings.Contains(s, "print:me") {
		t.Fatalf("the lease's context prints as %q, want its key", s)
	}
	if FromContext(lctx) != x || lctx.Err() == nil {
		t.Fatalf("released lease's context: lease %p (want %p), err %v (want cancelled)", FromContext(lctx), x, lctx.Err())
	}
}

// A hold keeps its owner token whatever its length: a token minted here lives in the hold
// itself, one handed over by another process (any length) and a borrowed hold's name apart.
func TestHoldKeepsOwnerTokensOfAnyLength(t *testing.T) {
	l := mustLocker(t, newMemStore())
	minted := newOwnerToken()
	for _, tc := range []struct{ owner, borrow string }{
		{minted, ""},
		{"short", ""},
		{strings.Repeat("o", 64), ""},
		{minted, "borrowname000000"},
	} {
		h := newHold(l.k, "owner:key", tc.owner, 1, tc.borrow, time.Now(), 0)
		if h.owner() != tc.owner || h.borrowName() != tc.borrow {
			t.Errorf("hold of owner %q, borrow %q: owner %q, borrow %q", tc.owner, tc.borrow, h.owner(), h.borrowName())
		}
		if tc.borrow == "" && len(tc.owner) == ownerTokenLen && h.ext.Load() != nil {
			t.Errorf("a minted token took a separate allocation (ext)")
		}
		h.stop()
	}
}

// The objects a held lock keeps stay in their size classes:
// a field added to one of them moves it to the next class for every held lock, which
// TestReleasingEverythingReturnsToBaseline sees only once the total crosses its bound.
func TestHeldLockObjectSizes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, max uintptr
	}{
		{"hold", unsafe.Sizeof(hold{}), 128},
		{"Lease", unsafe.Sizeof(Lease{}), 64},
		{"gateEntry", unsafe.Sizeof(gateEntry{}), 24},
	} {
		if tc.size > tc.max {
			t.Errorf("%s is %d bytes, at most %d wanted", tc.name, tc.size, tc.max)
		}
	}
}

// Lease.Grant tells a Redis acquisition, a handoff and a re-entry apart.
func TestLeaseGrant(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	// A handoff window of an hour: the default 20 ms, counted from the acquisition, can pass on
	// a loaded machine before the waiter has queued, and the lock then goes by the store.
	l := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(DefaultHandoff, time.Hour))
	first, err := l.Lock(ctx, "g")
	if err != nil {
		t.Fatal(err)
	}
	if first.Grant() != GrantStore {
		t.Fatalf("first lock: grant %v, want redis", first.Grant())
	}
	in, err := l.Lock(first.Context(), "g")
	if err != nil {
		t.Fatal(err)
	}
	if in.Grant() != GrantReentry || in.Grant().String() != "reentry" {
		t.Fatalf("nested lock: grant %v, want reentry", in.Grant())
	}
	_ = in.Release(ctx)
	got := make(chan *Lease, 1)
	go func() {
		lease, err := l.Lock(ctx, "g")
		if err != nil {
			t.Error(err)
		}
		got <- lease
	}()
	waitFor(t, 2*time.Second, "a waiter", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:g"].queued() == 1
	})
	_ = first.Release(ctx)
	second := <-got
	if second == nil {
		t.FailNow()
	}
	defer second.Release(ctx)
	if second.Grant() != GrantHandoff {
		t.Fatalf("queued waiter: grant %v, want handoff", second.Grant())
	}
}

// The Observer hears every retry of a wait, every renewal with its outcome, and a loss once.
func TestObserver(t *testing.T) {
	s, mr, _ := miniStore(t)
	ctx := context.Background()
	var (
		mu       sync.Mutex
		retries  []int
		renewals []error
		lost     []string
	)
	// The waiter's wait ends when its third retry is reported, not on a clock, so a slow
	// machine cannot end it before the first two.
	waitCtx, endWait := context.WithCancel(ctx)
	defer endWait()
	obs := Observer{
		Retry: func(_ context.Context, key string, attempt int, holderTTL time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			if key != "lock:busy" || holderTTL <= 0 {
				t.Errorf("Retry(%q, %d, %v)", key, attempt, holderTTL)
			}
			retries = append(retries, attempt)
			if attempt == 3 {
				endWait()
			}
		},
		Renewed: func(key string, err error) {
			mu.Lock()
			defer mu.Unlock()
			renewals = append(renewals, err)
		},
		Lost: func(key string) {
			mu.Lock()
			defer mu.Unlock()
			lost = append(lost, key)
		},
	}

	other := mustLocker(t, s, WithTTL(time.Minute))
	held, err := other.Lock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waiter := mustLocker(t, s, WithWait(time.Minute), WithRetry(LinearRetry(5*time.Millisecond)), WithObserver(obs))
	if _, err := waiter.Lock(waitCtx, "busy"); !errors.Is(err, ErrBusy) {
		t.Fatalf("%v, want ErrBusy", err)
	}
	mu.Lock()
	if len(retries) < 3 || retries[0] != 1 || retries[1] != 2 || retries[2] != 3 {
		t.Fatalf("retries %v, want 1, 2, 3, ...", retries)
	}
	mu.Unlock()

	clk := newManualClock()
	fs := &faultStore{Store: s}
	const ttl = 90 * time.Millisecond
	l := mustLocker(t, fs, WithTTL(ttl), WithObserver(obs), withClock(clk))
	lease, err := l.Lock(ctx, "renewed")
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(mr, 2*ttl/3, time.Millisecond) // two renewals
	refused := lockstore.ErrNotHeld
	fs.failRefresh.Store(&refused)
	clk.Step(mr, ttl/3, time.Millisecond) // refused: lost
	clk.Step(mr, ttl, time.Millisecond)   // nothing more
	mu.Lock()
	defer mu.Unlock()
	if len(renewals) != 3 || renewals[0] != nil || renewals[1] != nil || !errors.Is(renewals[2], ErrNotHeld) {
		t.Fatalf("renewals %v, want two successes then ErrNotHeld", renewals)
	}
	if len(lost) != 1 || lost[0] != "lock:renewed" {
		t.Fatalf("lost %v, want lock:renewed once", lost)
	}
	if context.Cause(lease.Context()) != ErrLost {
		t.Fatalf("cause %v, want ErrLost", context.Cause(lease.Context()))
	}
	_ = lease.Release(ctx)
}

// A lease lost (a renewal refused) stays lost: Refresh and TTL answer ErrNotHeld without asking
// the store, even when the key is back under its owner, since the lease's context has ended
// and its holder was told to stop.
func TestLostLeaseIsNotRefreshedBack(t *testing.T) {
	s, mr, _ := miniStore(t)
	l := mustLocker(t, s, WithMode(Reject))
	ctx := context.Background()
	lease, err := l.Lock(ctx, "lost")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	mr.Del(lease.Key())
	if err := lease.Refresh(ctx); !errors.Is(err, ErrNotHeld) || !lease.Lost() {
		t.Fatalf("Refresh of a deleted lock = %v, Lost %v; want ErrNotHeld and lost", err, lease.Lost())
	}
	// The key comes back under the lease's owner (a late write, a restore from a snapshot).
	if a, err := s.Acquire(ctx, lockstore.Request{Key: lease.Key(), Owner: lease.Owner(), TTL: time.Minute}); err != nil || !a.Acquired {
		t.Fatalf("re-creating the key as its owner: %+v, %v", a, err)
	}
	if err := lease.Refresh(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Refresh of the lost lease once its key is back = %v, want ErrNotHeld", err)
	}
	if ttl, err := lease.TTL(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("TTL of the lost lease = %v, %v; want ErrNotHeld", ttl, err)
	}
	if !lease.Lost() || context.Cause(lease.Context()) == nil {
		t.Errorf("the lease is no longer lost: Lost %v, context cause %v", lease.Lost(), context.Cause(lease.Context()))
	}
}

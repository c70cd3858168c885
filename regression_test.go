package flightlock

// Regression tests from the independent review of the issue 8 fixes (at 3bd9e26): each failed
// there and passes now.

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/redis/go-redis/v9"
)

// Deterministic replay of lock()'s steps: findLease sees the parent active, then the parent's
// grant ends and is handed to a local waiter W (nextGrant sets live=1), then enterSlot runs.
// The stale re-entry joins W's grant: two goroutines in the critical section, with the old fence.
func TestStaleReentryNeverJoinsTheNextGrant(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(8, time.Minute))
	g1, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wLease := make(chan *Lease, 1)
	go func() {
		lease, err := l.Lock(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		wLease <- lease
	}()
	waitFor(t, 2*time.Second, "waiter queued", func() bool {
		l.k.gate.mu.Lock()
		defer l.k.gate.mu.Unlock()
		return l.k.gate.entries["lock:k"].queued() == 1
	})
	// X, a goroutine carrying g1's context (background job), is inside lock(): findLease found g1.
	parent := findLease(g1.Context(), l.k.gate, "lock:k")
	if parent != g1 {
		t.Fatal("no parent")
	}
	// Meanwhile the handler returns: g1 released, the key handed to W.
	if err := g1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-wLease
	// X continues: re-enters the lease it found.
	x, err := l.reenter(g1.Context(), parent)
	if err != nil {
		t.Logf("reenter refused (correct): %v", err)
		_ = w.Release(ctx)
		return
	}
	t.Errorf("stale re-entry granted while W holds the key: W fence %d, X fence %d (X's ctx err %v)", w.Fence(), x.Fence(), x.Context().Err())
	_ = w.Release(ctx)
	_ = x.Release(ctx)
}

// The same through the public API only: a background goroutine carrying the handler's context
// (context.WithoutCancel, as the README allows) locks the key just as the handler releases it to
// a queued request W. Only overlaps of W and the background job are counted (the handler itself
// is documented as not excluded from re-entries it starts).
func TestBackgroundReentryRacingHandoffNeverOverlaps(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(5*time.Second), WithHandoff(1<<20, time.Hour))
	var inW, inBG, overlaps atomic.Int64
	for i := 0; i < 1500 && overlaps.Load() == 0; i++ {
		g1, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // a queued request
			defer wg.Done()
			lease, err := l.Lock(ctx, "k")
			if err != nil {
				return
			}
			inW.Add(1)
			if inBG.Load() > 0 {
				overlaps.Add(1)
			}
			time.Sleep(50 * time.Microsecond)
			inW.Add(-1)
			_ = lease.Release(ctx)
		}()
		bg := context.WithoutCancel(g1.Context())
		go func() { // a background job of the handler
			defer wg.Done()
			lease, err := l.Lock(bg, "k")
			if err != nil {
				return
			}
			inBG.Add(1)
			if inW.Load() > 0 {
				overlaps.Add(1)
			}
			time.Sleep(50 * time.Microsecond)
			inBG.Add(-1)
			_ = lease.Release(ctx)
		}()
		time.Sleep(time.Duration(i%7) * 10 * time.Microsecond)
		_ = g1.Release(ctx)
		wg.Wait()
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d overlaps of the queued request and the background job", n)
	}
}

// A handler locks k; its service layer locks k again (a nested re-entry) and fans out with
// mr.MapReduce-style goroutines that each lock k: every one of them carries the owner's
// context, so each enters at once, from the grant as from inside the re-entry.
func TestFanOutFromInsideAReentry(t *testing.T) {
	s, _, _ := miniStore(t)
	ctx := context.Background()
	l := mustLocker(t, s, WithWait(300*time.Millisecond))
	fanOut := func(ctx context.Context) error {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lease, err := l.Lock(ctx, "k")
				if err != nil {
					errs[i] = err
					return
				}
				time.Sleep(time.Millisecond)
				_ = lease.Release(ctx)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	outer, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(ctx)
	if err := fanOut(outer.Context()); err != nil {
		t.Fatalf("fan-out from the grant holder: %v", err)
	}
	inner, err := l.Lock(outer.Context(), "k") // nested Lock in the same goroutine
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Release(ctx)
	start := time.Now()
	if err := fanOut(inner.Context()); err != nil {
		t.Errorf("fan-out from inside a re-entry failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
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
func dropStores(t *testing.T) (*miniredis.Miniredis, *dropProxy, *lockstore.RedisStore, *lockstore.RedisStore) {
	t.Helper()
	mr := miniredis.RunT(t)
	direct := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	p := newDropProxy(t, mr.Addr())
	viaProxy := redis.NewClient(&redis.Options{Addr: p.ln.Addr().String(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	sA := lockstore.New(direct, lockstore.WithWatchLinger(0))
	sB := lockstore.New(viaProxy, lockstore.WithWatchLinger(0))
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

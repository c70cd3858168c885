package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
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

// kvCounter counts the KV requests (transactions, gets, puts, deletes) a client sends, and
// makes the next transaction whose first compare is on failKey commit but answer Unavailable
// (a reply lost on the way back).
type kvCounter struct {
	n       atomic.Int64
	failKey atomic.Pointer[string]
}

func (c *kvCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if strings.HasPrefix(method, "/etcdserverpb.KV/") {
		c.n.Add(1)
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if k := c.failKey.Load(); err == nil && k != nil && txnKey(req) == *k && c.failKey.CompareAndSwap(k, nil) {
		return status.Error(codes.Unavailable, "reply lost")
	}
	return err
}

// permitKeys returns n permit keys of key, as the Locker names them.
func permitKeys(key string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = flightlock.PermitKey("lock:", key, i+1)
	}
	return keys
}

// A look at permits that another owner holds is one transaction, whatever their number (up to
// MaxPermits within etcd's default --max-txn-ops), and marks each one waited on (its release
// notifies) and a read-held one wanted by a writer; a free permit costs one more, none when it
// is the first.
func TestPermitLookIsOneTransaction(t *testing.T) {
	c := etcdtest.Start(t)
	kc := &kvCounter{}
	ctx, holder, reader := bg(t), newStore(t, c.Client(t)), newStore(t, c.Client(t))
	taker := newStore(t, faultyClient(t, c, kc.intercept, nil))
	const ttl = 2 * time.Second
	take := func(keys []string) (lockstore.Acquisition, int64) {
		t.Helper()
		kc.n.Store(0)
		got, err := taker.Acquire(ctx, lockstore.Request{Key: keys[0], Permits: keys, Owner: ownerA, TTL: ttl})
		if err != nil {
			t.Fatalf("Acquire of %d permits: %v", len(keys), err)
		}
		return got, kc.n.Load()
	}
	if _, err := taker.Acquire(ctx, lockstore.Request{Key: "lock:warm", Owner: ownerA, TTL: ttl}); err != nil {
		t.Fatal(err) // the session lease exists, as in a running process
	}

	keys := permitKeys("eight", 8)
	if _, err := holder.AcquireAll(ctx, slices.Concat(keys[:3], keys[4:]), ownerB, ttl, "meta-b"); err != nil {
		t.Fatal(err)
	}
	if got, err := reader.Acquire(ctx, lockstore.Request{Key: keys[3], Owner: lockstore.ReadOwner(ownerA), TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	got, n := take(keys)
	if got.Acquired || got.HolderTTL <= 0 || got.Holder != "meta-b" || n != 1 {
		t.Fatalf("8 permits held elsewhere = %+v in %d KV requests; want busy with a holder in 1", got, n)
	}
	for i, k := range keys {
		if get(t, c.Client(t), WaiterKey(k)) == nil {
			t.Errorf("permit %d has no waiter mark: its release would notify nobody", i)
		}
	}
	if get(t, c.Client(t), writerKey(keys[3])) == nil {
		t.Error("the read-held permit has no writer mark: readers may starve the taker")
	}

	many := permitKeys("many", flightlock.MaxPermits)
	for _, half := range [][]string{many[:32], many[32:]} {
		if _, err := holder.AcquireAll(ctx, half, ownerB, ttl, "meta-b"); err != nil {
			t.Fatal(err)
		}
	}
	if got, n := take(many); got.Acquired || n != 1 {
		t.Fatalf("%d permits held elsewhere = %+v in %d KV requests, want busy in 1", len(many), got, n)
	}
	mustRelease(t, holder, many[40], ownerB)
	if got, n := take(many); !got.Acquired || got.Permit != 40 || got.Fence <= 0 || n != 2 {
		t.Fatalf("permit 40 free = %+v in %d KV requests, want it acquired in 2", got, n)
	}
	// Asked again, the owner re-enters the permit it holds, although the first is free now.
	mustRelease(t, holder, many[0], ownerB)
	if got, _ := take(many); !got.Acquired || !got.Reentered || got.Permit != 40 {
		t.Fatalf("permits asked again by their holder = %+v, want permit 40 re-entered", got)
	}
	if got, n := take(permitKeys("free", 8)); !got.Acquired || got.Permit != 0 || n != 1 {
		t.Fatalf("free permits = %+v in %d KV requests, want the first acquired in 1", got, n)
	}
}

// A look whose reply is lost after it took a permit is sent again: it re-enters that permit
// with its fence, and takes no second one.
func TestResentPermitLookReentersWhatItTook(t *testing.T) {
	c := etcdtest.Start(t)
	kc := &kvCounter{}
	ctx, holder := bg(t), newStore(t, c.Client(t))
	taker := newStore(t, faultyClient(t, c, kc.intercept, nil))
	const ttl = 2 * time.Second
	for _, taken := range []int{0, 2} { // by the look itself, and on the one-key path after it
		keys := permitKeys(fmt.Sprint("resent", taken), 4)
		if taken > 0 {
			if _, err := holder.AcquireAll(ctx, keys[:taken], ownerB, ttl, ""); err != nil {
				t.Fatal(err)
			}
		}
		kc.failKey.Store(&keys[taken])
		got, err := taker.Acquire(ctx, lockstore.Request{Key: keys[0], Permits: keys, Owner: ownerA, TTL: ttl})
		if err != nil || !got.Acquired || !got.Reentered || got.Permit != taken || got.Fence <= 0 {
			t.Fatalf("permit %d taken by a look whose reply was lost: %+v, %v; want it re-entered", taken, got, err)
		}
		if kc.failKey.Load() != nil {
			t.Fatal("no reply was lost")
		}
		for i, k := range keys {
			if kv := get(t, c.Client(t), k); i != taken && kv != nil && ownedBy(kv.Value, ownerA) {
				t.Errorf("the owner holds permit %d beside permit %d", i, taken)
			}
		}
	}
}

// A look with Want 3 over 5 permits, 3 of them free, takes those 3 (whether the first is among
// them or not), each the owner's with a fence of its own, in one look and a take each of the
// others at once; sent again, it re-enters all 3 and takes nothing more.
func TestPermitLookTakesWantOfTheFree(t *testing.T) {
	c := etcdtest.Start(t)
	kc := &kvCounter{}
	ctx, holder := bg(t), newStore(t, c.Client(t))
	taker := newStore(t, faultyClient(t, c, kc.intercept, nil))
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		busy, free []int
		requests   int64 // KV requests: the look (granting the first when free), and a take each
	}{
		{busy: []int{1, 3}, free: []int{0, 2, 4}, requests: 3},
		{busy: []int{0, 2}, free: []int{1, 3, 4}, requests: 4},
	} {
		keys := permitKeys(fmt.Sprint("want", tc.busy), 5)
		var others []string
		for _, i := range tc.busy {
			others = append(others, keys[i])
		}
		if _, err := holder.AcquireAll(ctx, others, ownerB, ttl, ""); err != nil {
			t.Fatal(err)
		}
		req := lockstore.Request{Key: keys[0], Permits: keys, Want: 3, Owner: ownerA, TTL: ttl}
		kc.n.Store(0)
		got, err := taker.Acquire(ctx, req)
		if err != nil || !got.Acquired || got.Reentered {
			t.Fatalf("Want 3 with permits %v free = %+v, %v; want them acquired", tc.free, got, err)
		}
		if n := kc.n.Load(); n != tc.requests {
			t.Errorf("Want 3 with permits %v free took %d KV requests, want %d", tc.free, n, tc.requests)
		}
		grants := append([]lockstore.PermitGrant{{Permit: got.Permit, Fence: got.Fence}}, got.More...)
		var permits []int
		for _, g := range grants {
			permits = append(permits, g.Permit)
			if g.Fence <= 0 {
				t.Errorf("permit %d granted with fence %d", g.Permit, g.Fence)
			}
			if err := taker.Refresh(ctx, keys[g.Permit], ownerA, ttl); err != nil {
				t.Errorf("permit %d granted is not the owner's: Refresh = %v", g.Permit, err)
			}
		}
		if !slices.Equal(permits, tc.free) {
			t.Fatalf("Want 3 with permits %v free granted %v (%+v)", tc.free, permits, got)
		}
		// Sent again with a permit freed since: the same 3 re-entered, nothing more taken.
		mustRelease(t, holder, others[0], ownerB)
		again, err := taker.Acquire(ctx, req)
		if err != nil || !again.Acquired || !again.Reentered || again.Permit != got.Permit || !slices.Equal(again.More, got.More) {
			t.Fatalf("Want 3 sent again = %+v, %v; want %+v re-entered", again, err, got)
		}
		if kv := get(t, c.Client(t), others[0]); kv != nil {
			t.Errorf("a request sent again took permit %q beside those it holds", others[0])
		}
	}
}

// mustRelease releases owner's own hold of key on s.
func mustRelease(t *testing.T, s *Store, key, owner string) {
	t.Helper()
	if _, err := s.Release(context.Background(), key, owner, "", 0); err != nil {
		t.Fatalf("Release(%q): %v", key, err)
	}
}

package etcdstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
)

// failedDeletes fails, while down, every transaction that would delete one of the keys it is
// armed for (as a leader change does: etcd answers Unavailable), and counts them.
type failedDeletes struct {
	mu     sync.Mutex
	keys   map[string]bool // guarded by mu
	down   atomic.Bool
	failed atomic.Int64
}

func (f *failedDeletes) arm(keys ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil {
		f.keys = make(map[string]bool)
	}
	for _, k := range keys {
		f.keys[k] = true
	}
}

func (f *failedDeletes) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*pb.TxnRequest); ok && f.down.Load() && f.deletes(r.Success) {
		f.failed.Add(1)
		return rpctypes.ErrGRPCLeaderChanged
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// deletes reports whether ops delete an armed key (exactly it, not a range).
func (f *failedDeletes) deletes(ops []*pb.RequestOp) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, op := range ops {
		if d := op.GetRequestDeleteRange(); d != nil && len(d.RangeEnd) == 0 && f.keys[string(d.Key)] {
			return true
		}
	}
	return false
}

// A grant the store cannot use (a fence floor written by hand makes no fence) is given back;
// when etcd fails that give-back (a leader change), nobody else knows of the key, which sits on
// the session lease the store keeps alive: the store must retry the give-back until it goes
// through, for every kind of acquisition that grants keys, or the key is taken from everyone
// until the store closes. Each case's lock TTL is far longer than the wait for the key to go,
// so only the give-back can free it.
func TestFailedGiveBackIsRetriedUntilItGoesThrough(t *testing.T) {
	c := etcdtest.Start(t)
	plain := c.Client(t)
	const ttl = time.Minute
	cases := []struct {
		name    string
		floors  []string // keys whose floor is made unreadable
		deleted []string // the keys the give-back deletes
		acquire func(ctx context.Context, s *Store) error
	}{
		{"lock", []string{"lock:w"}, []string{"lock:w"}, func(ctx context.Context, s *Store) error {
			_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:w", Owner: ownerA, TTL: ttl})
			return err
		}},
		{"read", []string{"lock:r"}, []string{readKey("lock:r", lockstore.ReadOwner(ownerA))}, func(ctx context.Context, s *Store) error {
			_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: lockstore.ReadOwner(ownerA), TTL: ttl})
			return err
		}},
		{"permit", []string{"sem:0"}, []string{"sem:0"}, func(ctx context.Context, s *Store) error {
			_, err := s.Acquire(ctx, lockstore.Request{Key: "sem", Permits: []string{"sem:0", "sem:1"}, Owner: ownerA, TTL: ttl})
			return err
		}},
		{"AcquireAll", []string{"all:b"}, []string{"all:a", "all:b", "all:c"}, func(ctx context.Context, s *Store) error {
			_, err := s.AcquireAll(ctx, []string{"all:a", "all:b", "all:c"}, ownerA, ttl, "")
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f failedDeletes
			s := newStore(t, faultyClient(t, c, f.intercept, nil))
			ctx := bg(t)
			for _, k := range tc.floors {
				if _, err := plain.Put(ctx, FloorKey(k), "written by hand"); err != nil {
					t.Fatal(err)
				}
			}
			f.arm(tc.deleted...)
			f.down.Store(true)
			if err := tc.acquire(ctx, s); err == nil {
				t.Fatal("an acquisition whose floor makes no fence succeeded")
			}
			for _, k := range tc.deleted {
				if get(t, plain, k) == nil {
					t.Fatalf("%q was given back although etcd failed every deletion", k)
				}
			}
			waitFor(t, 5*time.Second, "the failed give-back is tried again", func() bool {
				return f.failed.Load() > int64(len(tc.deleted))
			})
			f.down.Store(false) // etcd answers again
			waitFor(t, 5*time.Second, "the keys are given back", func() bool {
				for _, k := range tc.deleted {
					if get(t, plain, k) != nil {
						return false
					}
				}
				return true
			})
			for _, k := range tc.floors {
				if kv := get(t, plain, FloorKey(k)); kv == nil || string(kv.Value) != "written by hand" {
					t.Fatalf("the give-back changed the floor written by hand: %v", kv)
				}
				if _, err := plain.Delete(ctx, FloorKey(k)); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, 5*time.Second, "no entry left", func() bool { return s.Held() == 0 })
		})
	}
}

// A give-back that fails is retried only while the key is still the grant's: once another owner
// holds it, the retry leaves it alone.
func TestRetriedGiveBackLeavesAnotherOwnersLock(t *testing.T) {
	c := etcdtest.Start(t)
	plain := c.Client(t)
	var f failedDeletes
	s, other := newStore(t, faultyClient(t, c, f.intercept, nil)), newStore(t, plain)
	ctx := bg(t)
	if _, err := plain.Put(ctx, FloorKey("lock:o"), "written by hand"); err != nil {
		t.Fatal(err)
	}
	f.arm("lock:o")
	f.down.Store(true)
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:o", Owner: ownerA, TTL: time.Minute}); err == nil {
		t.Fatal("an acquisition whose floor makes no fence succeeded")
	}
	// Meanwhile the key goes (by hand) and another owner takes it.
	if _, err := plain.Delete(ctx, "lock:o"); err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Delete(ctx, FloorKey("lock:o")); err != nil {
		t.Fatal(err)
	}
	if got, err := other.Acquire(ctx, lockstore.Request{Key: "lock:o", Owner: ownerB, TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	taken := get(t, plain, "lock:o")
	tried := f.failed.Load()
	waitFor(t, 5*time.Second, "the failed give-back is tried again", func() bool { return f.failed.Load() > tried })
	f.down.Store(false)
	waitFor(t, 5*time.Second, "the retried give-back finds the key another owner's", func() bool { return s.Held() == 0 })
	if kv := get(t, plain, "lock:o"); kv == nil || kv.ModRevision != taken.ModRevision {
		t.Fatalf("the retried give-back touched another owner's lock: %v, was %v", kv, taken)
	}
}

// A named hold that Reenter wrote but cannot report (the keep-alive of the holder's lease did
// not answer) is given back, and that give-back is retried while etcd fails it, by a store that
// holds no lease of its own too: the hold would otherwise keep the key after its holder's
// release, on a lease of its own, until that lease runs out.
func TestUnreportedReentryIsGivenBackThoughItsFirstReleaseFails(t *testing.T) {
	c := etcdtest.Start(t)
	plain := c.Client(t)
	const key = "lock:h"
	f := &keyWrites{key: key, pass: 1} // the re-entry's write goes through
	holder, s := newStore(t, plain), newStore(t, f.client(t, c))
	ctx := bg(t)
	if got, err := holder.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: time.Minute}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	f.down.Store(true)
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	got, err := s.Reenter(rctx, key, ownerA, "h", time.Minute)
	cancel()
	if err == nil {
		t.Fatalf("a re-entry whose keep-alive failed = %+v, want an error", got)
	}
	if !hasHold(t, plain, key, "h") {
		t.Skip("the re-entry wrote no hold")
	}
	waitFor(t, 5*time.Second, "the failed give-back is tried again", func() bool { return f.failed.Load() > 1 })
	f.down.Store(false)
	waitFor(t, 5*time.Second, "the unreported hold is given back", func() bool { return !hasHold(t, plain, key, "h") })
	if _, err := holder.Release(ctx, key, ownerA, "", 0); err != nil {
		t.Fatal(err)
	}
	if get(t, plain, key) != nil {
		t.Fatal("the key outlived its holder's release")
	}
}

// hasHold reports whether the lock key holds the named hold.
func hasHold(t *testing.T, cli *clientv3.Client, key, hold string) bool {
	t.Helper()
	kv := get(t, cli, key)
	if kv == nil {
		return false
	}
	v, _ := parseValue(kv.Value)
	return v.hasHold(hold)
}

// keyWrites fails, while down, every keep-alive and every transaction that writes or deletes
// key after the first pass of them (as a leader change does: etcd answers Unavailable), and
// counts the transactions it failed.
type keyWrites struct {
	key    string
	pass   int64 // writes let through while down
	down   atomic.Bool
	writes atomic.Int64 // seen while down
	failed atomic.Int64
}

// client returns a client on c through f.
func (f *keyWrites) client(t *testing.T, c *etcdtest.Cluster) *clientv3.Client {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*pb.TxnRequest); ok && f.down.Load() && writesKey(r.Success, f.key) && f.writes.Add(1) > f.pass {
			f.failed.Add(1)
			return rpctypes.ErrGRPCLeaderChanged
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if f.down.Load() && method == "/etcdserverpb.Lease/LeaseKeepAlive" {
			return nil, rpctypes.ErrGRPCLeaderChanged
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	return faultyClient(t, c, unary, stream)
}

// writesKey reports whether ops write or delete key.
func writesKey(ops []*pb.RequestOp, key string) bool {
	for _, op := range ops {
		if p := op.GetRequestPut(); p != nil && string(p.Key) == key {
			return true
		}
		if d := op.GetRequestDeleteRange(); d != nil && string(d.Key) == key {
			return true
		}
	}
	return false
}

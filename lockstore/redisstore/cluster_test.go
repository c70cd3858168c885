package redisstore

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// On a real Redis Cluster every script must keep its keys in one slot (no CROSSSLOT error,
// whatever the key's bytes), and release notifications must reach a watcher connected to
// any node.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 cluster.Addrs,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
	})
	s := New(client, WithOnClose(client.Close))
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}

	for _, key := range []string{"lock:order:42", "lock:{user:7}:pay", "a}b", "\xff}\x00{", "}{x}", "ключ"} {
		first, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: time.Second, Meta: "host=h"})
		if err != nil || !first.Acquired {
			t.Fatalf("acquire %q: %+v %v", key, first, err)
		}
		busy, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: time.Second})
		if err != nil || busy.Acquired || busy.HolderTTL <= 0 {
			t.Fatalf("busy %q: %+v %v", key, busy, err)
		}
		if err := s.Refresh(ctx, key, ownerA, time.Second); err != nil {
			t.Fatalf("refresh %q: %v", key, err)
		}
		if _, err := s.Release(ctx, key, ownerA, "", 0); err != nil {
			t.Fatalf("release %q: %v", key, err)
		}
		second, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerB, TTL: time.Second})
		if err != nil || second.Fence <= first.Fence {
			t.Fatalf("fence %q: %d after %d (%v)", key, second.Fence, first.Fence, err)
		}
		if _, err := s.Release(ctx, key, ownerB, "", 0); err != nil {
			t.Fatal(err)
		}
	}

	// A look at a semaphore's permits is one script call per run of permits in one slot: one
	// for a key with a hash tag or no "{" (the permits' keys share its slot), and it takes the
	// first free permit across slots for a key whose "{" opens no tag.
	calls := &scriptCalls{}
	client.AddHook(calls)
	for _, base := range []string{"lock:sem", "lock:{sem}", "lock:sem{"} {
		permits := []string{base}
		for i := 2; i <= 8; i++ {
			permits = append(permits, lockstore.PermitKey(base, i))
		}
		for _, k := range permits {
			if got, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: time.Second}); err != nil || !got.Acquired {
				t.Fatalf("acquire %q: %+v %v", k, got, err)
			}
		}
		runs := 1
		for i := 1; i < len(permits); i++ {
			if lockstore.KeySlot(permits[i]) != lockstore.KeySlot(permits[i-1]) {
				runs++
			}
		}
		if runs != 1 && base != "lock:sem{" {
			t.Fatalf("the permits of %q are in %d runs of slots, want one", base, runs)
		}
		calls.n.Store(0)
		req := lockstore.Request{Key: base, Permits: permits, Owner: ownerB, TTL: time.Second}
		if got, err := s.Acquire(ctx, req); err != nil || got.Acquired || got.HolderTTL <= 0 {
			t.Fatalf("permits of %q all held: %+v %v", base, got, err)
		}
		if n := calls.n.Load(); n != int64(runs) {
			t.Fatalf("a look at the permits of %q made %d script calls, want %d (one per slot run)", base, n, runs)
		}
		if _, err := s.Release(ctx, permits[5], ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Acquire(ctx, req); err != nil || !got.Acquired || got.Permit != 5 {
			t.Fatalf("permits of %q with the sixth freed: %+v %v", base, got, err)
		}
	}

	// A watcher hears the release of a marked lock, whichever node holds its key.
	w, err := s.Watch(ctx, "lock:watched")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for {
		if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:watched", Owner: ownerA, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:watched", Owner: ownerB, TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(ctx, "lock:watched", ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.C():
			return
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no release notification on the cluster")
		}
	}
}

// scriptCalls counts the scripts a client sends (EVALSHA, and EVAL after NOSCRIPT).
type scriptCalls struct{ n atomic.Int64 }

func (*scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A holder keeps renewing its locks while their slot migrates to another master, through every
// step (the slot importing and migrating; its keys split between the two masters, locks apart
// from the slot's fence counter; all moved; the target owning the slot), and releases them
// cleanly after: renewals and releases follow ASK and MOVED, alone, in batched pipelines and
// in acknowledged (WAIT) pipelines.
func TestRenewalsAndReleasesFollowASlotMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster of three masters and three replicas")
	}
	cluster := redistest.StartReplicatedCluster(t, 3)
	var masters []string
	for _, m := range cluster.Masters {
		masters = append(masters, m.Addr)
	}
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"batched", nil},
		{"acknowledged", []Option{WithReplicas(1, 2*time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Seeds(), DisableIdentity: true, ContextTimeoutEnabled: true})
			s := New(client, append(tc.opts, WithOnClose(client.Close))...)
			t.Cleanup(func() { _ = s.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// More locks than lanes, in one slot: concurrent renewals queue and go out as
			// pipelines.
			var keys []string
			for i := range 2*DefaultLanes + 2 {
				keys = append(keys, "lock:{migrating-"+tc.name+"}:"+strconv.Itoa(i))
			}
			for _, key := range keys {
				if got, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
					t.Fatalf("acquire %q: %+v %v", key, got, err)
				}
			}
			held := keys
			renew := func(phase string) {
				t.Helper()
				errs := make([]error, len(held))
				var wg sync.WaitGroup
				for i, key := range held {
					wg.Go(func() { errs[i] = s.Refresh(ctx, key, ownerA, ttl) })
				}
				wg.Wait()
				batch := make([]lockstore.Renewal, 0, len(held))
				for _, key := range held {
					batch = append(batch, lockstore.Renewal{Key: key, Owner: ownerA, TTL: ttl})
				}
				errs = append(errs, s.RefreshAll(ctx, batch)...)
				for i, err := range errs {
					if err != nil {
						t.Errorf("%s: renewal of %q: %v", phase, held[i%len(held)], err)
					}
				}
			}
			release := func(phase string, keys ...string) {
				t.Helper()
				for _, key := range keys {
					if _, err := s.Release(ctx, key, ownerA, "", 0); err != nil {
						t.Errorf("%s: release of %q: %v", phase, key, err)
					}
				}
				held = held[len(keys):]
			}
			// reenter counts a re-entry of a held lock and gives it back.
			reenter := func(phase, key string) {
				t.Helper()
				if got, err := s.Reenter(ctx, key, ownerA, "h1", ttl); err != nil || !got.Reentered {
					t.Errorf("%s: re-entry of %q: %+v %v", phase, key, got, err)
				} else if _, err := s.Release(ctx, key, ownerA, "h1", 0); err != nil {
					t.Errorf("%s: release of the re-entry of %q: %v", phase, key, err)
				}
			}

			slot := int(lockstore.KeySlot(keys[0]))
			from := redistest.MasterAddrOf(t, slot, masters)
			to := masters[0]
			if to == from {
				to = masters[1]
			}
			renew("before")
			m := redistest.StartSlotMigration(t, slot, from, to, masters)
			renew("importing")
			m.Move(keys[:3]...) // the fence counter stays behind: the slot's keys are split
			renew("keys split")
			m.Move()
			renew("keys moved")
			reenter("keys moved", keys[0])
			release("keys moved", keys[:2]...) // ASK: the source still owns the slot
			m.Finish()
			renew("slot moved")
			reenter("slot moved", keys[2])
			// A fresh lock of the slot (while the slot migrated, Redis answered TRYAGAIN to a
			// new key beside the fence counter: busy, until now).
			fresh := "lock:{migrating-" + tc.name + "}:fresh"
			if got, err := s.Acquire(ctx, lockstore.Request{Key: fresh, Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
				t.Errorf("slot moved: acquire of %q: %+v %v", fresh, got, err)
			} else {
				held = append(held, fresh)
				keys = append(keys, fresh)
			}
			release("slot moved", held...) // MOVED
			for _, key := range keys {
				if n, err := client.Exists(ctx, key).Result(); err != nil || n != 0 {
					t.Errorf("%q after its release: exists %d, %v", key, n, err)
				}
			}
		})
	}
}

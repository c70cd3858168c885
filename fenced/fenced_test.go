package fenced_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/fenced"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A holder that stalls until its lock expires and goes to another holder, then resumes and
// writes, is refused: the newer holder's writes stand.
func TestStaleWriterAfterANewerHolderWrote(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	store := redisstore.New(redis.NewClient(srv.Options()))
	defer store.Close()
	locker, err := flightlock.New(store, flightlock.WithPrefix("lock:"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := flightlock.New(store, flightlock.WithPrefix("lock:"))
	if err != nil {
		t.Fatal(err)
	}

	first, err := locker.Lock(ctx, "sku:1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fenced.HIncrBy(ctx, rdb, "stock:1", "units", 10, first.Fence()); err != nil {
		t.Fatal(err)
	}
	// The first holder stalls; its lock expires in Redis (here: goes, as it would at its TTL)
	// and the next holder takes the key and writes twice under its one lease.
	rdb.Del(ctx, "lock:sku:1")
	second, err := other.Lock(ctx, "sku:1")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Release(ctx)
	for range 2 {
		if _, err := fenced.HIncrBy(ctx, rdb, "stock:1", "units", -3, second.Fence(), fenced.AtLeast(0)); err != nil {
			t.Fatalf("the current holder's write: %v", err)
		}
	}
	// The first holder resumes and writes what it had computed before its stall.
	_, err = fenced.HIncrBy(ctx, rdb, "stock:1", "units", -10, first.Fence())
	if !errors.Is(err, fenced.ErrStaleFence) {
		t.Fatalf("the stale holder's increment: %v, want ErrStaleFence", err)
	}
	if err := fenced.HSet(ctx, rdb, "stock:1", first.Fence(), "units", "999"); !errors.Is(err, fenced.ErrStaleFence) {
		t.Fatalf("the stale holder's HSet: %v, want ErrStaleFence", err)
	}
	if err := fenced.Set(ctx, rdb, "note:1", "newer", second.Fence()); err != nil {
		t.Fatal(err)
	}
	if err := fenced.Set(ctx, rdb, "note:1", "stale", first.Fence()); !errors.Is(err, fenced.ErrStaleFence) {
		t.Fatalf("the stale holder's Set: %v, want ErrStaleFence", err)
	}
	if v := rdb.HGet(ctx, "stock:1", "units").Val(); v != "4" {
		t.Errorf("units = %s, want 4 (10 - 3 - 3): a stale write got through", v)
	}
	if f, err := fenced.Fence(ctx, rdb, "stock:1"); err != nil || f != second.Fence() {
		t.Errorf("lock_fence = %d, %v; want the current holder's %d", f, err, second.Fence())
	}
	if v, f, err := fenced.Get(ctx, rdb, "note:1"); err != nil || v != "newer" || f != second.Fence() {
		t.Errorf("Get = %q, %d, %v; want newer, %d", v, f, err, second.Fence())
	}
	_ = first.Release(ctx) // ErrNotHeld: its lock is gone
}

func TestIncrementOptionsAndBadInput(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()

	if n, err := fenced.IncrBy(ctx, rdb, "bal:a", 100, 5); err != nil || n != 100 {
		t.Fatalf("IncrBy of a new entity: %d, %v", n, err)
	}
	if n, err := fenced.IncrBy(ctx, rdb, "bal:a", -101, 5, fenced.AtLeast(0)); !errors.Is(err, fenced.ErrBelowFloor) || n != 100 {
		t.Errorf("below the floor: %d, %v; want ErrBelowFloor and the current 100", n, err)
	}
	if _, err := fenced.HIncrBy(ctx, rdb, "bal:a", "other", 1, 5, fenced.Existing()); !errors.Is(err, fenced.ErrMissing) {
		t.Errorf("Existing on a missing field: %v, want ErrMissing", err)
	}
	if _, err := fenced.HIncrBy(ctx, rdb, "bal:a", fenced.FieldFence, 1, 5); err == nil {
		t.Error("incrementing the fence field itself was accepted")
	}
	if err := fenced.HSet(ctx, rdb, "bal:a", 5, "odd"); err == nil {
		t.Error("HSet with an odd number of strings was accepted")
	}
	if err := fenced.HSet(ctx, rdb, "bal:a", 5, fenced.FieldFence, "1"); err == nil {
		t.Error("HSet of the fence field itself was accepted")
	}
	rdb.HSet(ctx, "bal:b", fenced.FieldValue, "not a number")
	if _, err := fenced.IncrBy(ctx, rdb, "bal:b", 1, 5); err == nil {
		t.Error("incrementing a non-integer was accepted")
	}
	if n, _ := rdb.HGet(ctx, "bal:a", fenced.FieldValue).Int64(); n != 100 {
		t.Errorf("value %d after refused writes, want 100", n)
	}
	if _, _, err := fenced.Get(ctx, rdb, "nothing"); !errors.Is(err, redis.Nil) {
		t.Errorf("Get of a missing key: %v, want redis.Nil", err)
	}
}

// Concurrent writers with fences in any order: the stored fence only grows, and every write
// that was applied carried a fence at least as large as every write applied before it.
func TestConcurrentWritersNeverGoBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied []int64 // fences of the writes reported applied
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 200 {
				fence := r.Int64N(1000) + 1
				_, err := fenced.HIncrBy(ctx, rdb, "e", "n", 1, fence)
				switch {
				case err == nil:
					mu.Lock()
					applied = append(applied, fence)
					mu.Unlock()
				case !errors.Is(err, fenced.ErrStaleFence):
					t.Errorf("write: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	n, _ := rdb.HGet(ctx, "e", "n").Int64()
	if int(n) != len(applied) {
		t.Fatalf("n = %d, but %d writes reported applied", n, len(applied))
	}
	stored, _ := fenced.Fence(ctx, rdb, "e")
	var top int64
	for _, f := range applied {
		top = max(top, f)
	}
	if stored != top {
		t.Errorf("stored fence %d, want the largest applied %d", stored, top)
	}
	// Each applied write's fence was >= the stored fence when it ran; a refused one was below
	// it. With 1,600 writes of fences 1..1000, most after the first few hundred are refused.
	if len(applied) == 0 || len(applied) == 1600 {
		t.Errorf("%d of 1600 writes applied: the fence check did not run", len(applied))
	}
	t.Logf("%d of 1600 writes applied, stored fence %s", len(applied), strconv.FormatInt(stored, 10))
}

// Fences reach 2^63 (an etcd fence is the grant's revision shifted left by 20 bits, past 2^53
// once the revision passes 2^33), beyond the integers a Lua number holds exactly: fences that
// differ only below a double's precision must still be ordered, and the stored fence reported
// exactly.
func TestFencesBeyondTwoTo53AreOrderedExactly(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	for _, older := range []int64{
		1<<53 + 0,           // newer is 2^53+1: both are the double 2^53
		(1<<33 + 5) << 20,   // an etcd grant at revision 2^33+5, then a handoff under it
		1<<62 + 1000,        // both round to 2^62
		9223372036854775806, // 2^63-2, the newer is the largest int64
	} {
		newer := older + 1
		key := "e:" + strconv.FormatInt(older, 10)
		// The newer holder writes first; the stalled older one resumes and is refused.
		if _, err := fenced.HIncrBy(ctx, rdb, key, "n", 1, newer); err != nil {
			t.Fatalf("%d: the newer holder's increment: %v", newer, err)
		}
		_, err := fenced.HIncrBy(ctx, rdb, key, "n", 1, older)
		if !errors.Is(err, fenced.ErrStaleFence) {
			t.Errorf("%d after %d: HIncrBy returned %v, want ErrStaleFence", older, newer, err)
		} else if want := strconv.FormatInt(newer, 10); !strings.Contains(err.Error(), "fence "+want+",") {
			t.Errorf("stale error %q does not report the stored fence %s exactly", err, want)
		}
		if err := fenced.HSet(ctx, rdb, key, older, "m", "stale"); !errors.Is(err, fenced.ErrStaleFence) {
			t.Errorf("%d after %d: HSet returned %v, want ErrStaleFence", older, newer, err)
		}
		if err := fenced.Set(ctx, rdb, key, "stale", older); !errors.Is(err, fenced.ErrStaleFence) {
			t.Errorf("%d after %d: Set returned %v, want ErrStaleFence", older, newer, err)
		}
		// The holder of the stored fence writes again; n counts exactly its writes.
		if n, err := fenced.HIncrBy(ctx, rdb, key, "n", 1, newer); err != nil || n != 2 {
			t.Errorf("%d: a second write with the stored fence: %d, %v; want 2", newer, n, err)
		}
		if f, err := fenced.Fence(ctx, rdb, key); err != nil || f != newer {
			t.Errorf("stored fence %d, %v; want %d", f, err, newer)
		}
	}
	// Fences of any length compare as integers, not as text: 10 after 9, and 2^53+1 after 999.
	for _, step := range [][2]int64{{9, 10}, {999, 1<<53 + 1}} {
		key := "step:" + strconv.FormatInt(step[0], 10)
		if err := fenced.HSet(ctx, rdb, key, step[0], "v", "a"); err != nil {
			t.Fatal(err)
		}
		if err := fenced.HSet(ctx, rdb, key, step[1], "v", "b"); err != nil {
			t.Errorf("fence %d after %d: %v", step[1], step[0], err)
		}
		if err := fenced.HSet(ctx, rdb, key, step[0], "v", "c"); !errors.Is(err, fenced.ErrStaleFence) {
			t.Errorf("fence %d after %d: %v, want ErrStaleFence", step[0], step[1], err)
		}
	}
}

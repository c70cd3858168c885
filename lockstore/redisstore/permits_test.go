package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// A look at a semaphore's permits is one script call on a Redis node, whatever their slots, and
// takes up to Want of the free ones, each with a fence above its permit's last.
func TestPermitLookIsOneScriptCall(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	calls := &scriptCalls{}
	client.AddHook(calls)
	s := New(client, WithLanes(0))
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	permits := []string{"lock:sem"}
	for i := 2; i <= 8; i++ {
		permits = append(permits, "lock:sem#"+strconv.Itoa(i))
	}
	first := make([]int64, len(permits))
	for i, k := range permits {
		got, err := s.Acquire(ctx, lockstore.Request{Key: k, Owner: ownerA, TTL: time.Second})
		if err != nil || !got.Acquired {
			t.Fatalf("acquire %q: %+v %v", k, got, err)
		}
		first[i] = got.Fence
	}
	calls.n.Store(0)
	req := lockstore.Request{Key: permits[0], Permits: permits, Want: 3, Owner: ownerB, TTL: time.Second}
	if got, err := s.Acquire(ctx, req); err != nil || got.Acquired || got.HolderTTL <= 0 {
		t.Fatalf("permits all held: %+v %v", got, err)
	}
	if n := calls.n.Load(); n != 1 {
		t.Fatalf("a look at %d permits made %d script calls, want 1", len(permits), n)
	}
	for _, i := range []int{2, 5, 6} {
		if _, err := s.Release(ctx, permits[i], ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	req.Want = 2
	got, err := s.Acquire(ctx, req)
	if err != nil || !got.Acquired || got.Permit != 2 || len(got.More) != 1 || got.More[0].Permit != 5 {
		t.Fatalf("a look for 2 with permits 2, 5 and 6 free: %+v %v, want 2 and 5", got, err)
	}
	if got.Fence <= first[2] || got.More[0].Fence <= first[5] {
		t.Fatalf("fences %d and %d, not above the permits' last %d and %d", got.Fence, got.More[0].Fence, first[2], first[5])
	}
	for _, i := range []int{2, 5} {
		if err := s.Refresh(ctx, permits[i], ownerB, time.Second); err != nil {
			t.Fatalf("permit %d granted is not the owner's: %v", i, err)
		}
	}
	if _, err := s.TTL(ctx, permits[6]); err == nil {
		t.Fatal("a look for 2 took a third permit")
	}
	// A re-sent look re-enters what it took, and takes nothing more.
	again, err := s.Acquire(ctx, req)
	if err != nil || !again.Reentered || again.Permit != 2 || len(again.More) != 1 || again.More[0].Permit != 5 {
		t.Fatalf("a re-sent look: %+v %v, want 2 and 5 re-entered", again, err)
	}
	if _, err := s.TTL(ctx, permits[6]); err == nil {
		t.Fatal("a re-sent look took another permit")
	}
}

// A permit request WithReplicas on a client with no primary to send WAIT to (no pipelines) is
// answered with a store error, for one permit and for several.
func TestPermitsWithReplicasAndNoPrimaryFail(t *testing.T) {
	srv := redistest.Start(t)
	s := New(struct{ Client }{srv.Client()}, WithReplicas(1, time.Millisecond))
	t.Cleanup(func() { _ = s.Close() })
	for _, permits := range [][]string{{"p#0"}, {"p#0", "p#1"}} {
		res, err := s.Acquire(context.Background(), lockstore.Request{Key: "p", Owner: "o", TTL: time.Second, Permits: permits})
		if err == nil || res.Acquired {
			t.Fatalf("%d permits: %+v %v, want a store error", len(permits), res, err)
		}
	}
}

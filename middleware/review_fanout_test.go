package middleware

// Review of d01fe15 (propagated calls take turns through the re-entry slot, handover.Enter).
// d01fe15 made every propagated call, unary or stream, take the slots of all held keys and
// wait for them; a goroutine inside an in-process re-entry of one key then waited, in its
// call, for the slot of another key held by a goroutine that waited for its own: both calls
// ran out their deadlines. Since the follow-up a call waits only while its goroutine is inside
// no slot, and streams take no slot (their one-goroutine case is kept behind -tags knownbugs
// in knownbug_streams_test.go).

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Calls take every held key's slot, in key order, but slots taken by in-process re-entries are
// held across the call in any order. A holder of x with a nested lock of y fans out: goroutine
// Y re-enters x, goroutine X re-enters y (in process, no conflict), and each then calls a
// PropagateTo method that locks an unrelated key (h:2, h:3). Y's call waits for y's slot (X),
// X's call waits for x's slot (Y): both wait out their deadline. In process the same calls'
// locks would not wait at all, and before d01fe15 the calls went through. It failed on
// d01fe15 (both calls DeadlineExceeded).
func TestReviewCallsFromReentriesOfTwoKeysDoNotDeadlock(t *testing.T) {
	tr := newTestRedis(t)
	conn, holder := fanOutConn(t, tr, echoLeases)
	lx, err := holder.Lock(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer lx.Release(context.Background())
	ly, err := holder.Lock(lx.Context(), "y")
	if err != nil {
		t.Fatal(err)
	}
	defer ly.Release(context.Background())

	var inside, wg sync.WaitGroup
	inside.Add(2)
	var errs [2]error
	for i, key := range []string{"x", "y"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := holder.Lock(ly.Context(), key) // in-process re-entry: takes key's slot
			inside.Done()
			if err != nil {
				errs[i] = err
				return
			}
			defer r.Release(context.Background())
			inside.Wait() // both re-entries taken
			c, cancel := context.WithTimeout(r.Context(), time.Second)
			defer cancel()
			_, errs[i] = call(c, conn, "Host", &rpb.ServerReflectionRequest{Host: []string{"2", "3"}[i]})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("goroutine %d (inside a re-entry of %s): call of a method locking an unrelated key: %v (%v)",
				i, []string{"x", "y"}[i], err, status.Code(err))
		}
	}
}

// Review of 8869184: the same cross as above, but each goroutine calls with another context
// than the one its re-entry carries (the holder's lease of the other key, as code that locked
// and went on passing its original context does). Whether a goroutine is inside a slot was
// read from the call's context only, so both calls waited for each other's slot until their
// deadlines; it is now counted per goroutine.
func TestCallsWithAnotherContextThanTheReentryDoNotDeadlock(t *testing.T) {
	tr := newTestRedis(t)
	conn, holder := fanOutConn(t, tr, echoLeases)
	lx, err := holder.Lock(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer lx.Release(context.Background())
	ly, err := holder.Lock(context.Background(), "y") // taken apart: its context carries y only
	if err != nil {
		t.Fatal(err)
	}
	defer ly.Release(context.Background())
	withheld := func() (n float64) {
		withMetric(t, "flightlock_owners_withheld_total", func(labels map[string]string, v float64) {
			if labels["method"] == fullMethod("Host") {
				n = v
			}
		})
		return n
	}
	before := withheld()

	var inside, wg sync.WaitGroup
	inside.Add(2)
	var errs [2]error
	for i, in := range []*flightlock.Lease{lx, ly} {
		other := []*flightlock.Lease{ly, lx}[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := holder.Lock(in.Context(), strings.TrimPrefix(in.Key(), "lock:")) // takes in's slot
			inside.Done()
			if err != nil {
				errs[i] = err
				return
			}
			defer r.Release(context.Background())
			inside.Wait() // both re-entries taken
			c, cancel := context.WithTimeout(other.Context(), time.Second)
			defer cancel()
			_, errs[i] = call(c, conn, "Host", &rpb.ServerReflectionRequest{Host: []string{"2", "3"}[i]})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("goroutine %d: call with the other key's context: %v (%v)", i, err, status.Code(err))
		}
	}
	// Each call found the other key's slot taken while its goroutine was inside a slot: both
	// owners were withheld, and counted.
	if got := withheld() - before; got != 2 {
		t.Errorf("flightlock_owners_withheld_total{method=Host} grew by %v, want 2", got)
	}
}

// Review of 8869184: a goroutine's own re-entry took no slot for its calls, so a call through
// it ran beside a call of a goroutine it started with the re-entry's context (which takes the
// re-entry's slot): two downstream handlers inside h:1 at once. The own call now takes that
// slot without waiting and leaves the key out while the other goroutine is inside.
func TestCallThroughOwnReentryExcludesItsGoroutines(t *testing.T) {
	tr := newTestRedis(t)
	var in insideCounter
	entered, leave := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	conn, holder := fanOutConn(t, tr, func(ctx context.Context, req *rpb.ServerReflectionRequest) (*wrapperspb.StringValue, error) {
		defer in.enter()()
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-leave
		}
		return wrapperspb.String(leaseKeys(ctx)), nil
	})
	lease, err := holder.Lock(context.Background(), "h:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	done := make(chan error, 1)
	go func() { // g1
		r1, err := holder.Lock(lease.Context(), "h:1") // takes the lease's slot
		if err != nil {
			done <- err
			return
		}
		defer r1.Release(context.Background())
		second := make(chan error, 1)
		go func() { // g2, started with r1's context: its call takes r1's slot
			_, err := call(r1.Context(), conn, "Host", &rpb.ServerReflectionRequest{Host: "1"})
			second <- err
		}()
		<-entered
		c, cancel := context.WithTimeout(r1.Context(), 300*time.Millisecond)
		_, _ = call(c, conn, "Host", &rpb.ServerReflectionRequest{Host: "1"}) // g1's own call: must not get in
		cancel()
		close(leave)
		done <- <-second
	}()
	if err := <-done; err != nil {
		t.Fatalf("g2's call: %v", err)
	}
	if n := in.most.Load(); n > 1 {
		t.Fatalf("%d downstream handlers inside h:1 at once: a call through a goroutine's own re-entry "+
			"ran beside the call of a goroutine it started", n)
	}
}

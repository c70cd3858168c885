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
	"sync"
	"testing"
	"time"

	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
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

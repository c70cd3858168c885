package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/poll"
	"github.com/flightlock/flightlock/lockstore"
)

// gateHook holds the first single command sent while armed until release is closed, so a test
// can keep a lane busy; it counts pipelines and the commands in them, and can hold, slow down
// or fail them.
type gateHook struct {
	armed     atomic.Bool
	entered   chan struct{}
	release   chan struct{}
	pipeArmed atomic.Bool   // hold the next pipeline, after it was counted, until pipeGo
	pipeIn    chan struct{} // receives when a held pipeline arrives
	pipeGo    chan struct{}
	pipeFail  atomic.Bool  // a held pipeline then fails with errReplyLost instead of running
	pipeDelay atomic.Int64 // the replies of a pipeline arrive this many ns after it ran
	pipelines atomic.Int64
	piped     atomic.Int64
}

// errReplyLost is the error of every command of a failed pipeline (gateHook.pipeFail).
var errReplyLost = errors.New("test: connection lost before the reply")

func newGateHook() *gateHook {
	return &gateHook{entered: make(chan struct{}, 1), release: make(chan struct{}),
		pipeIn: make(chan struct{}, 1), pipeGo: make(chan struct{})}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.CompareAndSwap(true, false) {
			h.entered <- struct{}{}
			<-h.release
		}
		return next(ctx, cmd)
	}
}

func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		h.piped.Add(int64(len(cmds)))
		if h.pipeArmed.CompareAndSwap(true, false) {
			h.pipeIn <- struct{}{}
			<-h.pipeGo
			if h.pipeFail.Load() {
				for _, cmd := range cmds {
					cmd.SetErr(errReplyLost)
				}
				return errReplyLost
			}
		}
		err := next(ctx, cmds)
		if d := time.Duration(h.pipeDelay.Load()); d > 0 {
			// A slow server: the commands ran, their replies come d later, unless the
			// pipeline's context ends first (the socket deadline of a real connection).
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				for _, cmd := range cmds {
					cmd.SetErr(ctx.Err())
				}
				return ctx.Err()
			}
		}
		return err
	}
}

// oneLaneStore is a store on miniredis with a single lane, and the hook that can block it.
func oneLaneStore(t *testing.T) (*RedisStore, *redis.Client, *gateHook) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true})
	h := newGateHook()
	c.AddHook(h)
	s := New(c, WithLanes(1))
	t.Cleanup(func() { _ = s.Close(); _ = c.Close() })
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, c, h
}

// occupyLane starts a release of a free key that blocks in the hook until h.release is
// closed, and returns once it holds the store's only lane.
func occupyLane(t *testing.T, s *RedisStore, h *gateHook) <-chan struct{} {
	t.Helper()
	h.armed.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.Release(context.Background(), "lock:lane", ownerA, "", 0)
	}()
	<-h.entered
	return done
}

func queued(s *RedisStore) int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return len(s.batch.queue)
}

func waitQueued(t *testing.T, s *RedisStore, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for queued(s) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", queued(s), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Calls that find every lane busy go out together, as one pipeline, and each gets its own reply.
func TestBusyLanesBatchCalls(t *testing.T) {
	s, c, h := oneLaneStore(t)
	ctx := context.Background()
	laneFree := occupyLane(t, s, h)

	const n = 20
	results := make([]lockstore.Acquisition, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Half the callers fight over one key: exactly one of them may win.
			key := "lock:b" + strconv.Itoa(i)
			if i%2 == 1 {
				key = "lock:shared"
			}
			results[i], errs[i] = s.Acquire(ctx, lockstore.Request{Key: key, Owner: "owner" + strconv.Itoa(i), TTL: time.Minute})
		}()
	}
	waitQueued(t, s, n)
	close(h.release)
	wg.Wait()
	<-laneFree

	if got := h.pipelines.Load(); got != 1 || h.piped.Load() != n {
		t.Fatalf("%d pipelines with %d commands, want 1 with %d", got, h.piped.Load(), n)
	}
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if i%2 == 0 && !results[i].Acquired {
			t.Fatalf("call %d on a free key: %+v", i, results[i])
		}
		if i%2 == 1 && results[i].Acquired {
			winners++
			// The losers marked the lock (" ~") after the winner took it.
			v := c.Get(ctx, "lock:shared").Val()
			if !strings.HasPrefix(v, "owner"+strconv.Itoa(i)+" "+strconv.FormatInt(results[i].Fence, 10)+" ") || !strings.HasSuffix(v, " ~") {
				t.Fatalf("shared key holds %q, the winner was call %d", v, i)
			}
		}
	}
	if winners != 1 {
		t.Fatalf("%d callers won the shared key in one batch, want 1", winners)
	}
	// A lane is freed after its batch's callers have their results: wait for it, not the race.
	poll.Until(t, 5*time.Second, time.Millisecond, "the lanes to be freed and the queue empty after the batch", func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return len(s.batch.queue) == 0 && s.batch.busy == 0
	})
}

// A queued call whose context ends before a lane takes it returns at its deadline and is never
// sent: a late acquire would take a lock that nobody releases.
func TestAbandonedCallIsNeverSent(t *testing.T) {
	s, c, h := oneLaneStore(t)
	laneFree := occupyLane(t, s, h)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Acquire(ctx, lockstore.Request{Key: "lock:late", Owner: ownerB, TTL: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued acquire past its deadline: %v, want DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("queued acquire returned after %v, its deadline was 50ms", waited)
	}
	close(h.release)
	<-laneFree
	// The lane took the queue when its call returned, found only the abandoned call, and sent
	// nothing.
	got, err := s.Acquire(context.Background(), lockstore.Request{Key: "lock:probe", Owner: ownerA, TTL: time.Minute})
	if err != nil || !got.Acquired {
		t.Fatalf("store unusable after an abandoned call: %+v %v", got, err)
	}
	if n := c.Exists(context.Background(), "lock:late").Val(); n != 0 {
		t.Fatal("the abandoned acquire was sent after its caller left")
	}
}

// A batch that meets NOSCRIPT (the server's script cache was flushed) falls back to EVAL.
func TestBatchAfterScriptFlush(t *testing.T) {
	s, c, h := oneLaneStore(t)
	ctx := context.Background()
	laneFree := occupyLane(t, s, h)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Acquire(ctx, lockstore.Request{Key: "lock:nf" + strconv.Itoa(i), Owner: ownerA, TTL: time.Minute})
			if err == nil && !res.Acquired {
				err = errors.New("not acquired")
			}
			errs[i] = err
		}()
	}
	waitQueued(t, s, 3)
	admin := redis.NewClient(&redis.Options{Addr: c.Options().Addr, Protocol: 2, DisableIdentity: true})
	defer admin.Close()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	close(h.release)
	wg.Wait()
	<-laneFree
	for i, err := range errs {
		if err != nil {
			t.Fatalf("batched acquire %d after SCRIPT FLUSH: %v", i, err)
		}
	}
}

// A store on a client without pipelines (a test double, say) sends every call directly.
func TestNoBatchingWithoutPipelines(t *testing.T) {
	if newBatcher(scripterOnly{}, 4) != nil {
		t.Fatal("batcher built on a client that cannot pipeline")
	}
	s, _, _ := oneLaneStore(t)
	if newBatcher(s.client, 0) != nil {
		t.Fatal("WithLanes(0) still batches")
	}
}

type scripterOnly struct{ Client }

// Under a storm of concurrent calls, some of whose contexts end early, every lane comes back
// and the queue drains: a leaked lane would leave calls queued until their deadlines.
func TestLanesComeBackAfterAStorm(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		var wg sync.WaitGroup
		stop := time.Now().Add(500 * time.Millisecond)
		for g := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; time.Now().Before(stop); i++ {
					d := time.Second
					if i%7 == 0 {
						d = time.Duration(g%5) * 100 * time.Microsecond // some end while queued
					}
					ctx, cancel := context.WithTimeout(context.Background(), d)
					key := "lock:storm" + strconv.Itoa((g*31+i)%50)
					owner := "o" + strconv.Itoa(g)
					if res, err := b.store.Acquire(ctx, lockstore.Request{Key: key, Owner: owner, TTL: time.Minute}); err == nil && res.Acquired {
						_, _ = b.store.Release(context.Background(), key, owner, "", 0)
					}
					cancel()
				}
			}()
		}
		wg.Wait()
		deadline := time.Now().Add(5 * time.Second)
		for {
			b.store.batch.mu.Lock()
			busy, queue := b.store.batch.busy, len(b.store.batch.queue)
			b.store.batch.mu.Unlock()
			if busy == 0 && queue == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the storm: %d lanes busy, %d calls queued", busy, queue)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// While every lane hangs, callers that give up do not pile up in the queue.
func TestAbandonedCallsDoNotPileUp(t *testing.T) {
	s, _, h := oneLaneStore(t)
	laneFree := occupyLane(t, s, h)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 10 * compactAt {
		if _, err := s.Acquire(done, lockstore.Request{Key: "lock:gone" + strconv.Itoa(i), Owner: ownerA, TTL: time.Minute}); err == nil {
			t.Fatal("acquire with a cancelled context succeeded while the lane hung")
		}
	}
	if n := queued(s); n > 2*compactAt {
		t.Fatalf("%d calls queued after %d callers gave up, want at most %d", n, 10*compactAt, 2*compactAt)
	}
	close(h.release)
	<-laneFree
}

// acquireArgs is ARGV of acquire.lua (see the contract at the top of the script) for owner and a
// one-minute lease without metadata, as RedisStore.Acquire sends it. Keep the tests' argument
// list here only, so a change of the script's contract is one edit.
func acquireArgs(owner string) []any { return []any{owner, ttlMillis(time.Minute), ""} }

// runAcquire runs acquire.lua for key and owner through the batcher, with late as the hook for
// a reply that arrives after the caller left.
func runAcquire(ctx context.Context, s *RedisStore, key, owner string, late func(*redis.Cmd)) *redis.Cmd {
	return s.batch.run(ctx, acquireScript, []string{key, lockstore.FenceKey(key)}, late, acquireArgs(owner)...)
}

// A call fails on its own deadline only, not at the earliest deadline among its batch's
// callers: against a Redis that answers in 400 ms, a call with 5 s left next to one with 150 ms
// left gets its reply, and the short one leaves at its own deadline, without waiting for a
// reply it cannot use.
func TestBatchCallFailsOnItsOwnDeadlineOnly(t *testing.T) {
	s, _, h := oneLaneStore(t)
	laneFree := occupyLane(t, s, h)
	const answer = 400 * time.Millisecond
	h.pipeDelay.Store(int64(answer))

	type result struct {
		res     lockstore.Acquisition
		err     error
		elapsed time.Duration
	}
	call := func(key string, timeout time.Duration) <-chan result {
		out := make(chan result, 1)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		start := time.Now()
		go func() {
			defer cancel()
			res, err := s.Acquire(ctx, lockstore.Request{Key: key, Owner: ownerA, TTL: time.Minute})
			out <- result{res, err, time.Since(start)}
		}()
		return out
	}
	short := call("lock:short", 150*time.Millisecond)
	long := call("lock:long", 5*time.Second)
	waitQueued(t, s, 2)
	close(h.release) // the lane frees and sends both calls as one batch

	sr, lr := <-short, <-long
	<-laneFree
	if got, n := h.pipelines.Load(), h.piped.Load(); got != 1 || n != 2 {
		t.Fatalf("%d pipelines with %d commands, want both calls in one batch", got, n)
	}
	if lr.err != nil || !lr.res.Acquired {
		t.Fatalf("call with a 5s deadline, batched with one of 150ms, against a Redis answering in %v: %+v, %v after %v; want its reply",
			answer, lr.res, lr.err, lr.elapsed)
	}
	if !errors.Is(sr.err, context.DeadlineExceeded) {
		t.Fatalf("call with a 150ms deadline against a Redis answering in %v: %+v, %v; want DeadlineExceeded", answer, sr.res, sr.err)
	}
	// Its deadline, not the reply, ended it: it returned before the reply arrived.
	if sr.elapsed >= 350*time.Millisecond {
		t.Fatalf("call with a 150ms deadline returned after %v, with the batch's reply at %v", sr.elapsed, answer)
	}
}

// A caller that leaves while its acquire is on the wire returns at once with its context's
// error, and the acquire's late hook sees the reply: a lock it took is released (nobody would
// release it before its TTL otherwise), a lock the owner already held (re-entry) or another
// owner holds is left alone.
func TestLateAcquireReplyIsReleased(t *testing.T) {
	const key = "lock:late"
	for _, tc := range []struct {
		name     string
		holder   string // who holds key before the late acquire by ownerB; "" nobody
		wantCode int64  // the late acquire's reply code
	}{
		{"taken", "", acquireTaken},
		{"re-entered", ownerB, acquireReentered},
		{"busy", ownerA, acquireBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c, h := oneLaneStore(t)
			bg := context.Background()
			if tc.holder != "" {
				if res, err := s.Acquire(bg, lockstore.Request{Key: key, Owner: tc.holder, TTL: time.Minute}); err != nil || !res.Acquired {
					t.Fatalf("setup: %+v, %v", res, err)
				}
			}
			laneFree := occupyLane(t, s, h)
			h.pipeArmed.Store(true)

			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			hooked := make(chan int64, 1)
			release := s.releaseOnReply(key, ownerB, "", acquireTaken)
			late := func(cmd *redis.Cmd) {
				release(cmd)
				code := int64(-1)
				if got, _, _, err := reply(cmd); err == nil {
					code = got
				}
				hooked <- code
			}
			out := make(chan *redis.Cmd, 1)
			go func() { out <- runAcquire(ctx, s, key, ownerB, late) }()
			waitQueued(t, s, 1)
			close(h.release) // the lane frees and sends the queue as a batch, which the hook holds
			<-h.pipeIn
			cancel()
			select {
			case cmd := <-out:
				if !errors.Is(cmd.Err(), context.Canceled) {
					t.Fatalf("caller that left while its acquire was on the wire got %v, want Canceled", cmd.Err())
				}
			case <-time.After(2 * time.Second):
				close(h.pipeGo)
				t.Fatalf("caller still waits for the reply of its call on the wire after its context ended: %v", (<-out).Err())
			}
			close(h.pipeGo) // the acquire runs now, after its caller left
			<-laneFree
			select {
			case code := <-hooked:
				if code != tc.wantCode {
					t.Fatalf("late reply code %d, want %d", code, tc.wantCode)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the late hook never ran")
			}
			v := c.Get(bg, key).Val()
			switch {
			case tc.holder == "" && v != "":
				t.Fatalf("the lock an abandoned acquire took is still held: %q", v)
			case tc.holder != "" && !strings.HasPrefix(v, tc.holder+" "):
				t.Fatalf("key holds %q after a late %s reply, want it still held by its holder", v, tc.name)
			}
		})
	}
}

// The late hook runs when the reply is an error too, and off the lane: a slow hook does not
// keep the next calls waiting.
func TestLateHookRunsOnAnErrorAndOffTheLane(t *testing.T) {
	s, _, h := oneLaneStore(t)
	laneFree := occupyLane(t, s, h)
	h.pipeArmed.Store(true)
	h.pipeFail.Store(true)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hooked := make(chan *redis.Cmd, 1)
	unblock := make(chan struct{})
	late := func(cmd *redis.Cmd) {
		hooked <- cmd
		<-unblock // a hook stuck on a slow clean-up
	}
	out := make(chan *redis.Cmd, 1)
	go func() { out <- runAcquire(ctx, s, "lock:lost", ownerB, late) }()
	waitQueued(t, s, 1)
	close(h.release)
	<-h.pipeIn
	cancel()
	select {
	case cmd := <-out:
		if !errors.Is(cmd.Err(), context.Canceled) {
			t.Fatalf("caller that left while its acquire was on the wire got %v, want Canceled", cmd.Err())
		}
	case <-time.After(2 * time.Second):
		close(h.pipeGo)
		t.Fatalf("caller still waits for the reply of its call on the wire after its context ended: %v", (<-out).Err())
	}
	close(h.pipeGo) // the pipeline fails
	defer close(unblock)
	select {
	case cmd := <-hooked:
		if !errors.Is(cmd.Err(), errReplyLost) {
			t.Fatalf("late hook got %v, want the pipeline's error", cmd.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the late hook never ran for a failed reply")
	}
	<-laneFree
	next, cancelNext := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelNext()
	if res, err := s.Acquire(next, lockstore.Request{Key: "lock:next", Owner: ownerA, TTL: time.Minute}); err != nil || !res.Acquired {
		t.Fatalf("acquire while a late hook is still running: %+v, %v; the hook holds the lane", res, err)
	}
}

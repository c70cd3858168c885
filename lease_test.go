package flightlock

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/redistest"
	"github.com/flightlock/flightlock/lockstore"
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
			s := lockstore.New(client, lockstore.WithOnClose(client.Close))
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
	s := lockstore.New(srv.Client())
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

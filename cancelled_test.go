package flightlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// lostReplyStore runs every Acquire in the store and then answers with err, as a client whose
// call reached the server but whose caller's context ended before the reply came back (go-redis
// with ContextTimeoutEnabled, etcd's client): the lock is taken, and the caller does not know.
type lostReplyStore struct {
	lockstore.Store
	err error
}

func (s *lostReplyStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta string) (lockstore.Acquisition, error) {
	_, _ = s.Store.Acquire(context.WithoutCancel(ctx), key, owner, ttl, meta)
	return lockstore.Acquisition{}, s.err
}

// An acquisition whose reply is lost because its caller's context ended, by deadline or by
// cancellation (an HTTP client that went away, a gRPC call cancelled upstream), gives back the
// lock it may have taken: nothing else will release it, and the key would stay refused for the
// whole TTL (the same user's retry answered 409 for 10 s). It was given back for a deadline
// only, not for a cancellation.
func TestLostAcquireReplyGivesTheLockBack(t *testing.T) {
	for _, cause := range []error{context.Canceled, context.DeadlineExceeded} {
		t.Run(cause.Error(), func(t *testing.T) {
			s, _, _ := miniStore(t)
			ctx := context.Background()
			l := mustLocker(t, &lostReplyStore{Store: s, err: cause}, WithTTL(10*time.Second), WithMode(Reject))
			if _, err := l.Lock(ctx, "k"); !errors.Is(err, cause) {
				t.Fatalf("Lock with a lost reply: %v, want %v", err, cause)
			}
			// Given back in the background: Lock does not wait for the store once more.
			waitFor(t, time.Second, "the lock taken by the lost acquisition given back", func() bool {
				_, err := s.TTL(ctx, "lock:k")
				return errors.Is(err, ErrNotHeld)
			})
			other := mustLocker(t, s, WithMode(Reject))
			lease, err := other.Lock(ctx, "k")
			if err != nil {
				t.Fatalf("another owner after the lost acquisition: %v", err)
			}
			_ = lease.Release(ctx)
		})
	}
}

// overtakenStore loses the reply of every Acquire when its caller's context ends, and lets the
// call land only after the caller's give-back has reached the store: the give-back overtook
// it (a stalled server that reads the give-back's connection first; miniredis under load).
type overtakenStore struct {
	lockstore.Store
	releaseSeen chan struct{} // closed by the first Release
	once        sync.Once
	landed      chan struct{}
}

func (s *overtakenStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta string) (lockstore.Acquisition, error) {
	<-ctx.Done()
	go func() {
		defer close(s.landed)
		<-s.releaseSeen
		_, _ = s.Store.Acquire(context.Background(), key, owner, ttl, meta)
	}()
	return lockstore.Acquisition{}, ctx.Err()
}

func (s *overtakenStore) Release(ctx context.Context, key, owner, hold string, lastFence int64) (int, error) {
	n, err := s.Store.Release(ctx, key, owner, hold, lastFence)
	s.once.Do(func() { close(s.releaseSeen) })
	return n, err
}

// A give-back that reaches the store before the timed-out acquisition it undoes finds nothing
// to release; the acquisition then takes the key for nobody. The give-back asks again, so the
// key is free again well within the TTL instead of refused for all of it.
func TestGiveBackOvertakingItsAcquisitionStillFreesTheKey(t *testing.T) {
	s, _, _ := miniStore(t)
	os := &overtakenStore{Store: s, releaseSeen: make(chan struct{}), landed: make(chan struct{})}
	l := mustLocker(t, os, WithTTL(time.Minute), WithMode(Reject))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock whose reply was lost: %v, want context.DeadlineExceeded", err)
	}
	<-os.landed
	if _, err := s.TTL(context.Background(), "lock:k"); err != nil {
		t.Fatalf("the late acquisition did not take the key (%v): the test proves nothing", err)
	}
	waitFor(t, 5*time.Second, "the late acquisition given back", func() bool {
		_, err := s.TTL(context.Background(), "lock:k")
		return errors.Is(err, ErrNotHeld)
	})
}

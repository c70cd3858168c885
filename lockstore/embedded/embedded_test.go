package embedded

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

const (
	ownerA = "owner-a"
	ownerB = "owner-b"
)

func TestEmbeddedClockMoves(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:m", Owner: ownerA, TTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		got, err := s.Acquire(ctx, lockstore.Request{Key: "lock:m", Owner: ownerB, TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if got.Acquired {
			return // the embedded server expired the first lock on its own
		}
		if time.Now().After(deadline) {
			t.Fatal("embedded store never expired a 50ms lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close closes the store's client and stops the server; a second Close does nothing.
func TestEmbeddedCloseStopsServer(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Client().(*redis.Client).Options().Addr
	ctx := context.Background()
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:c", Owner: ownerA, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Acquire(ctx, lockstore.Request{Key: "lock:c", Owner: ownerB, TTL: time.Second}); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("acquire after Close: %v, want redis.ErrClosed", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("embedded server still listens on %s after Close", addr)
	}
}

package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestProxyFaults(t *testing.T) {
	srv := Start(t)
	p, err := NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr, DisableIdentity: true, ContextTimeoutEnabled: true, PoolSize: 2})
	ping := func(timeout time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		err := c.Ping(ctx).Err()
		return time.Since(start), err
	}
	if _, err := ping(time.Second); err != nil {
		t.Fatalf("ping through the proxy: %v", err)
	}

	p.SetDelay(150 * time.Millisecond)
	if d, err := ping(time.Second); err != nil || d < 150*time.Millisecond {
		t.Fatalf("delayed ping took %v (err %v), want at least 150ms", d, err)
	}
	p.SetDelay(0)
	if d, err := ping(time.Second); err != nil || d > 100*time.Millisecond {
		t.Fatalf("ping after the delay was lifted took %v (err %v)", d, err)
	}

	if p.Stall(300*time.Millisecond) == 0 {
		t.Fatal("no connection to stall")
	}
	if _, err := ping(100 * time.Millisecond); err == nil {
		t.Fatal("ping on a stalled connection answered")
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := ping(time.Second); err != nil {
		t.Fatalf("ping after the stall: %v", err)
	}

	if p.Cut() == 0 {
		t.Fatal("no connection to cut")
	}
	if p.Conns() != 0 {
		t.Fatalf("%d connections left after Cut", p.Conns())
	}
	// The pooled connection is dead: go-redis retries the command on a fresh one.
	if _, err := ping(time.Second); err != nil {
		t.Fatalf("ping after the cut: %v", err)
	}

	_ = c.Close()
	if err := p.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	goleak.VerifyNone(t)
}

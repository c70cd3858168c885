package etcdstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// A release that fails while etcd cannot be reached (its outcome unknown) is retried by the
// store soon after etcd answers again, not once the lock's TTL has run out: its holder gave the
// lock up, and no other hold of this store counts on it, so the key would otherwise answer
// busy to every other process for up to a TTL after the outage.
func TestFailedReleaseIsRetriedSoonAfterTheOutage(t *testing.T) {
	c := etcdtest.Start(t)
	member := strings.TrimPrefix(c.Members[0].ClientURL, "http://")
	p := redistest.StartProxy(t, member)
	cut := newStore(t, etcdtest.NewClient(t, "http://"+p.Addr))
	other := newStore(t, c.Client(t))
	ctx := bg(t)
	const ttl = 10 * time.Second
	if got, err := cut.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerA, TTL: ttl}); err != nil || !got.Acquired {
		t.Fatal(got, err)
	}
	p.Stall(time.Hour) // etcd stops answering this process
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := cut.Release(rctx, "lock:r", ownerA, "", 0)
	cancel()
	if err == nil {
		t.Fatal("a release through a stalled connection succeeded")
	}
	time.Sleep(2 * time.Second) // the outage: the store's retries fail too
	p.Cut()                     // etcd answers again (the client reconnects)
	healed := time.Now()
	for {
		got, err := other.Acquire(ctx, lockstore.Request{Key: "lock:r", Owner: ownerB, TTL: ttl})
		if err == nil && got.Acquired {
			break
		}
		if since := time.Since(healed); since > ttl/2 {
			t.Fatalf("%v after the outage the key is still held (acquire: %+v, %v); its holder released it during the outage",
				since.Round(time.Millisecond), got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the key was free %v after the outage", time.Since(healed).Round(time.Millisecond))
}

package lockstore

import (
	"context"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// On a real Redis Cluster every script must keep its keys in one slot (no CROSSSLOT error,
// whatever the key's bytes), and release notifications must reach a watcher connected to
// any node.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:                 cluster.Addrs,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
	})
	s := New(client, WithOnClose(client.Close))
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}

	for _, key := range []string{"lock:order:42", "lock:{user:7}:pay", "a}b", "\xff}\x00{", "}{x}", "ключ"} {
		first, err := s.Acquire(ctx, key, ownerA, time.Second, "host=h")
		if err != nil || !first.Acquired {
			t.Fatalf("acquire %q: %+v %v", key, first, err)
		}
		busy, err := s.Acquire(ctx, key, ownerB, time.Second, "")
		if err != nil || busy.Acquired || busy.HolderTTL <= 0 {
			t.Fatalf("busy %q: %+v %v", key, busy, err)
		}
		if err := s.Refresh(ctx, key, ownerA, time.Second); err != nil {
			t.Fatalf("refresh %q: %v", key, err)
		}
		if _, err := s.Release(ctx, key, ownerA, "", 0); err != nil {
			t.Fatalf("release %q: %v", key, err)
		}
		second, err := s.Acquire(ctx, key, ownerB, time.Second, "")
		if err != nil || second.Fence <= first.Fence {
			t.Fatalf("fence %q: %d after %d (%v)", key, second.Fence, first.Fence, err)
		}
		if _, err := s.Release(ctx, key, ownerB, "", 0); err != nil {
			t.Fatal(err)
		}
	}

	// A watcher hears the release of a marked lock, whichever node holds its key.
	w, err := s.Watch(ctx, "lock:watched")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for {
		if _, err := s.Acquire(ctx, "lock:watched", ownerA, time.Second, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, "lock:watched", ownerB, time.Second, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(ctx, "lock:watched", ownerA, "", 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.C():
			return
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no release notification on the cluster")
		}
	}
}

// Package replicas measures what replica acknowledgement (Lock.Redis.Replicas: 1,
// redisstore.WithReplicas) costs an acquisition, on a primary with one replica on loopback:
//
//	cd bench && go test -run '^$' -bench . -benchmem ./replicas
package replicas

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// BenchmarkLockRelease is one Lock and Release of a key of its own, one goroutine, without and
// with the replica's acknowledgement of the acquisition (releases never wait).
func BenchmarkLockRelease(b *testing.B) {
	primary := redistest.Start(b).Addr
	redistest.StartReplica(b, primary) // in sync when it returns

	for _, c := range []struct {
		name string
		opts []redisstore.Option
	}{
		{"replicas=0", nil},
		{"replicas=1", []redisstore.Option{redisstore.WithReplicas(1, 100*time.Millisecond)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			client := redis.NewClient(&redis.Options{Addr: primary, DisableIdentity: true})
			store := redisstore.New(client, append(c.opts, redisstore.WithOnClose(client.Close))...)
			defer store.Close()
			if err := store.Preload(context.Background()); err != nil {
				b.Fatal(err)
			}
			l, err := flightlock.New(store, flightlock.WithPrefix("bench:"))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				lease, err := l.Lock(ctx, "k"+strconv.Itoa(i))
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package redisstore_test

import (
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/flightlock/flightlock/lockstore/storetest"
	"github.com/redis/go-redis/v9"
)

// The Redis store keeps the store contract on a real redis-server.
func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, storetest.Config{
		TTL: time.Second,
		Open: func(t testing.TB) lockstore.Store {
			s := redisstore.New(srv.Client())
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Faulty: func(t testing.TB) (lockstore.Store, func(), func()) {
			p := redistest.StartProxy(t, srv.Addr)
			opts := srv.Options()
			opts.Addr = p.Addr
			c := redis.NewClient(opts)
			s := redisstore.New(c, redisstore.WithOnClose(c.Close))
			t.Cleanup(func() { _ = s.Close() })
			return s, func() { p.SetDelay(time.Hour); p.Stall(time.Hour) }, func() { p.SetDelay(0); p.Cut() }
		},
	})
}

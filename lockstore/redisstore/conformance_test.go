package redisstore_test

import (
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/flightlock/flightlock/lockstore/storetest"
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
	})
}

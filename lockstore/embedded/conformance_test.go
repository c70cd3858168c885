package embedded_test

import (
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/storetest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

// The embedded store keeps the store contract on its in-process miniredis: the first store
// runs the server (and moves its clock), the others are clients of it, as other processes of
// a development machine would be.
func TestConformance(t *testing.T) {
	first, err := embedded.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	opts := *first.Client().(*redis.Client).Options()
	storetest.Run(t, storetest.Config{
		TTL: time.Second,
		Open: func(t testing.TB) lockstore.Store {
			c := redis.NewClient(&opts)
			s := redisstore.New(c)
			t.Cleanup(func() {
				_ = s.Close()
				_ = c.Close()
			})
			return s
		},
	})
}

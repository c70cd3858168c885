package redisstore_test

import (
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/internal/testenv/storetest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

// The Redis store keeps the store contract on a real redis-server.
func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	proxied := func(t testing.TB) (*redisstore.RedisStore, *redistest.Proxy) {
		p := redistest.StartProxy(t, srv.Addr)
		opts := srv.Options()
		opts.Addr = p.Addr
		c := redis.NewClient(opts)
		s := redisstore.New(c, redisstore.WithOnClose(c.Close), redisstore.WithWatchLinger(0))
		t.Cleanup(func() { _ = s.Close() })
		return s, p
	}
	storetest.Run(t, storetest.Config{
		TTL: time.Second,
		Open: func(t testing.TB) lockstore.Store {
			s := redisstore.New(srv.Client())
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Faulty: func(t testing.TB) (lockstore.Store, []storetest.Fault) {
			s, p := proxied(t)
			stop := make(chan struct{})
			resets := func() {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(5 * time.Millisecond):
							p.Cut()
						}
					}
				}()
			}
			healed := func() { p.SetDelay(0); p.Cut() }
			return s, []storetest.Fault{
				{Name: "replies held back", Start: func() { p.SetDelay(time.Hour) }, Heal: healed},
				{Name: "black hole", Start: func() { p.SetDelay(time.Hour); p.Stall(time.Hour) }, Heal: healed},
				{Name: "connections reset", Start: resets, Heal: func() { stop <- struct{}{} }, Passable: true},
				{Name: "server down", Start: srv.Stop, Heal: srv.Restart},
			}
		},
		Severable: func(t testing.TB) (lockstore.Store, storetest.Link) { return proxied(t) },
	})
}

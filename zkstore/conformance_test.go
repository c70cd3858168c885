package zkstore_test

import (
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/internal/testenv/storetest"
	"github.com/flightlock/flightlock/internal/testenv/zktest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/zkstore"
)

// The ZooKeeper store keeps the store contract on a real server; each store is a session of
// its own.
func TestConformance(t *testing.T) {
	srv := zktest.Start(t)
	proxied := func(t testing.TB) (*zkstore.Store, *redistest.Proxy) {
		p := redistest.StartProxy(t, srv.Addr)
		s, err := zkstore.Dial(zkstore.Config{Hosts: []string{p.Addr}, SessionTimeout: 9 * time.Second,
			Root: "/flightlock-conformance", TickTime: 500 * time.Millisecond, SyncLimit: 5})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, p
	}
	storetest.Run(t, storetest.Config{
		TTL:      2 * time.Second,
		Sessions: true,
		Open: func(t testing.TB) lockstore.Store {
			s, err := zkstore.Dial(zkstore.Config{Hosts: []string{srv.Addr}, SessionTimeout: 9 * time.Second,
				Root: "/flightlock-conformance", TickTime: 500 * time.Millisecond, SyncLimit: 5})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Faulty: func(t testing.TB) (lockstore.Store, []storetest.Fault) {
			s, p := proxied(t)
			return s, []storetest.Fault{{Name: "black hole", Start: func() { p.SetDelay(time.Hour); p.Stall(time.Hour) },
				Heal: func() { p.SetDelay(0); p.Cut() }}}
		},
		Severable: func(t testing.TB) (lockstore.Store, storetest.Link) { return proxied(t) },
	})
}

package etcdstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/internal/testenv/storetest"
	"github.com/flightlock/flightlock/lockstore"
)

// The etcd store keeps the store contract on a real etcd member.
func TestConformance(t *testing.T) {
	c := etcdtest.Start(t)
	proxied := func(t testing.TB) (*etcdstore.Store, *redistest.Proxy) {
		p := redistest.StartProxy(t, strings.TrimPrefix(c.Members[0].ClientURL, "http://"))
		s, err := etcdstore.New(etcdtest.NewClient(t, p.Addr))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, p
	}
	storetest.Run(t, storetest.Config{
		TTL: 2 * time.Second,
		Open: func(t testing.TB) lockstore.Store {
			s, err := etcdstore.New(c.Client(t))
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

package etcdstore_test

import (
	"testing"
	"time"

	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/storetest"
)

// The etcd store keeps the store contract on a real etcd member.
func TestConformance(t *testing.T) {
	c := etcdtest.Start(t)
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
	})
}

package zkstore

import (
	"testing"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// startProxy puts a fault proxy (plain TCP) in front of a ZooKeeper client port.
func startProxy(t *testing.T, addr string) *redistest.Proxy { return redistest.StartProxy(t, addr) }

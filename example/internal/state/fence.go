package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/flightlock/flightlock"
)

// ErrNoLease means a write was attempted without holding the lease that fences it: the lock
// rule of the route or method is missing or renders another key.
var ErrNoLease = errors.New("state: no lease held for the entity")

// LeaseFence returns the fence of the lease that ctx holds on the lock key (prefix included),
// or on the first of keys it holds: the entity's lock in each store its rule may use. A
// transfer holds two leases; each write must use the fence of its own entity's lock.
func LeaseFence(ctx context.Context, keys ...string) (int64, error) {
	for _, key := range keys {
		for _, lease := range flightlock.AllFromContext(ctx) {
			if lease.Key() == key {
				return lease.Fence(), nil
			}
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrNoLease, keys)
}

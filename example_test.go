package flightlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore/embedded"
)

func Example() {
	store, err := embedded.New() // in-memory Redis; redisstore.New(redisClient) in production
	if err != nil {
		panic(err)
	}
	defer store.Close()

	locker := flightlock.MustNew(store, flightlock.WithTTL(5*time.Second), flightlock.WithMode(flightlock.Reject))
	ctx := context.Background()

	err = locker.Do(ctx, "order:42", func(ctx context.Context) error {
		lease := flightlock.FromContext(ctx)
		fmt.Println("holding", lease.Key())

		// A second request for the same user is turned away without a Redis call.
		_, err := locker.TryLock(context.Background(), "order:42")
		fmt.Println("duplicate busy:", errors.Is(err, flightlock.ErrBusy))

		// The same request may lock the key again: locks re-enter by context.
		inner, err := locker.Lock(ctx, "order:42")
		if err != nil {
			return err
		}
		return inner.Release(ctx)
	})
	fmt.Println("done:", err)
	// Output:
	// holding lock:order:42
	// duplicate busy: true
	// done: <nil>
}

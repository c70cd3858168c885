// Package embedded runs the Redis store on an in-process miniredis, for development and tests
// (its locks protect only its own processes), apart so that the core does not need miniredis.
package embedded

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/redis/go-redis/v9"
)

// tick is how often the clock moves (miniredis expires keys only then): the TTLs' precision.
const tick = 10 * time.Millisecond

// advance moves mr's clock on by now - last, at most maxStep, and returns now.
func advance(mr *miniredis.Miniredis, last, now time.Time) time.Time {
	mr.FastForward(min(now.Sub(last), maxStep))
	return now
}

// maxStep bounds one move of the clock: a held-up ticker (a starved process) moving it the whole
// wait would end keys set meanwhile early; a clock that falls behind only lengthens locks.
const maxStep = 2 * tick

// New returns a store, with opts, on a miniredis started on a free loopback port; Close stops
// it and closes the client (RESP2: miniredis delivers pub/sub messages in it).
func New(opts ...redisstore.Option) (*redisstore.RedisStore, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("flightlock: start embedded redis: %w", err)
	}
	client := redis.NewClient(&redis.Options{
		Addr:                  mr.Addr(),
		Protocol:              2,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
	})
	stop := make(chan struct{})
	var ticker sync.WaitGroup
	ticker.Go(func() {
		t := time.NewTicker(tick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				last = advance(mr, last, now)
			}
		}
	})

	// Close runs these last first: the client is closed, then the clock and the server stop.
	all := append(slices.Clip(opts), redisstore.WithOnClose(func() error {
		close(stop)
		ticker.Wait()
		mr.Close()
		return nil
	}), redisstore.WithOnClose(client.Close))
	return redisstore.New(client, all...), nil
}

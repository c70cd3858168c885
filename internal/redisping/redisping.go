// Package redisping waits for a redis-server that was just started to answer, for the test
// servers (internal/redistest) and the benchmark's (bench/internal/redisserver).
package redisping

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Await returns once the server at addr answers PING, or an error naming addr and the last
// failure when it has not within the given time.
func Await(addr string, within time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

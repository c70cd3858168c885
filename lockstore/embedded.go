package lockstore

import (
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// embeddedTick is how often the embedded server's clock is moved forward. Lock TTLs on the
// embedded store are accurate to about this much.
const embeddedTick = 10 * time.Millisecond

// NewEmbedded starts an in-process miniredis on a free loopback port and returns a store on it,
// for development and tests when no shared Redis exists. Locks taken on it protect only the
// processes that use this store: it is not for production. Close stops the server.
//
// miniredis expires keys only when its clock is moved, so a goroutine advances it in real time
// (every 10ms); TTLs then behave as on a real server. The client speaks RESP2, the protocol
// with which miniredis delivers pub/sub messages.
func NewEmbedded(opts ...Option) (*RedisStore, error) {
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
	ticker.Add(1)
	go func() {
		defer ticker.Done()
		t := time.NewTicker(embeddedTick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	}()

	s := New(client, opts...)
	s.closers = append(s.closers, func() error {
		close(stop)
		ticker.Wait()
		mr.Close()
		return nil
	}, client.Close)
	return s, nil
}

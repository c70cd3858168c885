package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// isRedirect reports a MOVED or ASK reply past the redirects go-redis (or runAcked) follows:
// the slot moves; nothing ran. It checks err for nil first: HasErrorPrefix allocates.
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK "))
}

// tryAgainPause is how long a release waits before it sends a call that got TRYAGAIN again.
const tryAgainPause = 10 * time.Millisecond

// slotMoving reports a TRYAGAIN (a script's keys split between two nodes mid-migration), MOVED
// or ASK reply: the slot migrates, nothing ran. A redirect makes a Cluster client reload slots.
func (s *RedisStore) slotMoving(err error) bool {
	if isRedirect(err) {
		s.reloadSlots()
		return true
	}
	return err != nil && redis.HasErrorPrefix(err, "TRYAGAIN")
}

// failed is op's error on key. Without a Redis error reply, a Cluster client reloads its slot
// map: the master may have died for a promoted replica, else learnt from a MOVED or in a minute.
func (s *RedisStore) failed(op, key string, err error) error {
	var reply redis.Error
	if !errors.As(err, &reply) || errors.Is(err, redis.ErrClosed) {
		s.reloadSlots()
	}
	return fmt.Errorf("flightlock: %s %q: %w", op, key, err)
}

// reloadSlots makes a Cluster client reload its slot map (lazily, one reload at a time).
func (s *RedisStore) reloadSlots() {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// isRedirect reports a MOVED or ASK reply past the bound of redirects that go-redis's Cluster
// client (or runAcked) follows: the slot moved or is moving; nothing ran. It checks err for nil
// first, as slotMoving does: HasErrorPrefix allocates, and a success must not.
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK "))
}

// tryAgainPause is how long a release waits before it sends a call that got TRYAGAIN again.
const tryAgainPause = 10 * time.Millisecond

// slotMoving reports a TRYAGAIN, MOVED or ASK reply: the key's slot migrates and nothing ran.
// TRYAGAIN: a script's keys are split between two nodes while their slot migrates; the same
// call succeeds once the migration moved both keys. After a redirect it makes a Cluster client
// reload its slot map.
func (s *RedisStore) slotMoving(err error) bool {
	if isRedirect(err) {
		s.reloadSlots()
		return true
	}
	return err != nil && redis.HasErrorPrefix(err, "TRYAGAIN")
}

// failed is the error of op on key that failed with err. A call that failed without a reply
// from Redis makes a Cluster client reload its slot map: the slot's master may have died and a
// replica been promoted, which the client would otherwise learn only from a MOVED reply or its
// periodic reload, a minute later.
func (s *RedisStore) failed(op, key string, err error) error {
	if !isRedisReply(err) {
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

// isRedisReply reports an error reply of Redis, as opposed to an error of the connection or of
// the caller's context.
func isRedisReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.ErrClosed)
}

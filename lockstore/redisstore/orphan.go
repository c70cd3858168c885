package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// orphanReleaseTimeout bounds the release of an orphan's lock, else left to its TTL.
const orphanReleaseTimeout = time.Second

// releaseOnReply is the late hook (batcher.run) of a call taking hold ("": the own) of key for
// owner: a reply with code, counting a hold for this very call (acquireTaken for an acquire),
// names a hold nobody knows of, given up, not left to its TTL. Busy took nothing, an error tells
// nothing, and re-entered means a hold counted on (or go-redis re-sent this call, which the
// store cannot tell; the Locker gives back an acquisition it gave up on).
func (s *RedisStore) releaseOnReply(key, owner, hold string, code int64) func(*redis.Cmd) {
	return func(cmd *redis.Cmd) {
		if got, _, _, err := reply(cmd); err != nil || got != code {
			return
		}
		_ = s.giveUp(key, owner, hold)
	}
}

// giveUp releases a hold nobody will use (an orphan's, one not replicated) on the client, not
// a lane, bounded (else left to its TTL), with lastFence 0: it handed out no further fence.
func (s *RedisStore) giveUp(key, owner, hold string) error {
	ctx, cancel := context.WithTimeout(context.Background(), orphanReleaseTimeout)
	defer cancel()
	script, keys, args := s.releaseCall(key, owner, hold, 0, "")
	return script.Run(ctx, s.client, keys, args...).Err()
}

// giveUpWithin gives up owner's grants of permits (hold) at once, reporting whether all were by
// ctx's end; the rest goes on in the background, or is left to its TTL.
func (s *RedisStore) giveUpWithin(ctx context.Context, permits []string, grants []lockstore.PermitGrant, owner, hold string) bool {
	errs := make(chan error, len(grants))
	for _, g := range grants {
		go func() { errs <- s.giveUp(permits[g.Permit], owner, hold) }()
	}
	for range grants {
		select {
		case err := <-errs:
			if err != nil && !errors.Is(err, redis.Nil) {
				return false
			}
		case <-ctx.Done():
			return false
		}
	}
	return true
}

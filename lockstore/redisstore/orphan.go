package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// orphanReleaseTimeout bounds the release of a lock that an acquire took after its caller left;
// one that does not finish in time leaves the lock to its TTL.
const orphanReleaseTimeout = time.Second

// releaseOnReply returns the late hook (see batcher.run) of a call that takes hold (the
// acquisition's own when "") of key for owner: when the reply arrives after its caller left and
// has code, that of a reply that counted a hold for this very call (acquireTaken for an
// acquire), nobody knows of that hold, so the hook gives it up rather than leave it held until
// its TTL. Other replies leave the key alone: busy took nothing; an error says nothing about
// what ran; an acquire's re-entered means owner already held the key for a hold still counted
// on (or this call ran twice after go-redis re-sent it, which the store cannot tell apart; the
// Locker gives back an acquisition it gave up on).
func (s *RedisStore) releaseOnReply(key, owner, hold string, code int64) func(*redis.Cmd) {
	return func(cmd *redis.Cmd) {
		if got, _, _, err := reply(cmd); err != nil || got != code {
			return
		}
		_ = s.giveUp(key, owner, hold)
	}
}

// giveUp releases one hold that a call took but nobody will use (an orphan whose caller left,
// a grant that replicas did not acknowledge). It goes straight to the client, not waiting for
// a lane, and is bounded: a release that fails leaves the key to its TTL. The hold handed out
// no fence beyond its grant: lastFence "0".
func (s *RedisStore) giveUp(key, owner, hold string) error {
	ctx, cancel := context.WithTimeout(context.Background(), orphanReleaseTimeout)
	defer cancel()
	script, keys, args := s.releaseCall(key, owner, hold, 0, "")
	return script.Run(ctx, s.client, keys, args...).Err()
}

// giveUpWithin gives up the grants of permits to owner (hold), all at once, and reports whether
// each was given up by ctx's end; what is not goes on in the background, or is left to its TTL.
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

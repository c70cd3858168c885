package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// orphanReleaseTimeout bounds the release of a lock that an acquire took after its caller left;
// one that does not finish in time leaves the lock to its TTL.
const orphanReleaseTimeout = time.Second

// releaseIfTaken returns the late hook of an acquire of key by owner (see batcher.run): when
// the reply arrives after its caller left and says the key was taken for owner, nobody knows
// of that lock, so the hook releases it rather than leave it held until its TTL. Other replies
// leave the key alone: busy took nothing; re-entered means owner already held the key for a
// hold still counted on (or this call ran twice after go-redis re-sent it, which the store
// cannot tell apart; the Locker gives back an acquisition it gave up on); an error says
// nothing about what ran.
func (s *RedisStore) releaseIfTaken(key, owner string) func(*redis.Cmd) {
	return s.releaseOnReply(key, owner, "", acquireTaken)
}

// releaseOnReply returns a late hook that gives up one hold of key for owner when a script reply
// (as reply reads it) has code, the code of a reply that counted a hold for this very call.
func (s *RedisStore) releaseOnReply(key, owner, hold string, code int64) func(*redis.Cmd) {
	return func(cmd *redis.Cmd) {
		if got, _, _, err := reply(cmd); err != nil || got != code {
			return
		}
		s.giveUp(key, owner, hold)
	}
}

// giveUp releases one hold that a call took but nobody will use (an orphan whose caller left,
// a grant that replicas did not acknowledge). It goes straight to the client, not waiting for
// a lane, and is bounded: a release that fails leaves the key to its TTL. The hold handed out
// no fence beyond its grant: lastFence "0".
func (s *RedisStore) giveUp(key, owner, hold string) {
	ctx, cancel := context.WithTimeout(context.Background(), orphanReleaseTimeout)
	defer cancel()
	script, keys, args := s.releaseCall(key, owner, hold, 0, "")
	_ = script.Run(ctx, s.client, keys, args...).Err()
}

package redisstore

import (
	"context"
	"time"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/redis/go-redis/v9"
)

// orphanReleaseTimeout bounds the release of a lock that an acquire took after its caller left.
// A release that does not finish in time leaves the lock to its TTL, as a failed release does.
const orphanReleaseTimeout = time.Second

// releaseIfTaken returns the late hook of an acquire of key by owner (see batcher.run): when
// the acquire's reply arrives after its caller left and says the key was taken for owner,
// nobody knows of that lock, so the hook releases it rather than leave it held until its TTL
// (a batched call no longer waits for its reply past its own deadline).
// Other replies leave the key alone: busy took nothing, and re-entered means owner already held
// the key for a hold that is still counted on. (A re-entered reply can also be this very call
// run twice, go-redis having re-sent the pipeline after the connection dropped with the first
// reply on it; the store cannot tell that from a re-entrant acquisition of a
// lockstore.Store user, whose hold it must not drop. The Locker mints an owner per acquisition and gives
// back an acquisition it gave up on (keeper.giveBack), whichever run took the key.) An error
// reply says nothing about what ran, so it is left too (the root package's Locker releases
// after an acquire that timed out).
func (s *RedisStore) releaseIfTaken(key, owner string) func(*redis.Cmd) {
	return s.releaseOnReply(key, owner, "", acquireTaken)
}

// releaseOnReply returns a late hook that gives up one hold of key for owner when a script reply
// of acquire.lua or reenter.lua (as reply reads it) has code, the code of a reply that counted
// a hold for this very call. The release goes straight to the client, not through the batcher:
// it runs in the hook's own goroutine, after its caller left, and must not wait for a lane.
func (s *RedisStore) releaseOnReply(key, owner, hold string, code int64) func(*redis.Cmd) {
	return func(cmd *redis.Cmd) {
		if got, _, _, err := reply(cmd); err != nil || got != code {
			return
		}
		s.giveUp(key, owner, hold)
	}
}

// giveUp releases one hold that a call took but nobody will use (an orphan whose caller left,
// a grant that replicas did not acknowledge). It goes straight to the client, not through the
// batcher, and is bounded: a release that fails leaves the key to its TTL.
func (s *RedisStore) giveUp(key, owner, hold string) {
	ctx, cancel := context.WithTimeout(context.Background(), orphanReleaseTimeout)
	defer cancel()
	// The hold handed out no fence beyond the one it was granted: "0" (release.lua).
	if lockstore.IsReadOwner(owner) {
		_ = readReleaseScript.Run(ctx, s.client, []string{key, readersKey(key)}, owner, s.channelPrefix, writerReserveMillis).Err()
		return
	}
	_ = releaseScript.Run(ctx, s.client, []string{key, lockstore.FenceKey(key)}, owner, s.channelPrefix, "0", hold, "").Err()
}

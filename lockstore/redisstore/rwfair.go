package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore"
)

// readersKey names the sorted set of key's read holds (readacquire.lua).
func readersKey(key string) string { return lockstore.SideKey("readers", key) }

// lineKey and lineDueKey name key's fair line and its places' deadlines (fairacquire.lua).
func lineKey(key string) string    { return lockstore.SideKey("line", key) }
func lineDueKey(key string) string { return lockstore.SideKey("linedue", key) }

// writerReserve is how long the last reader keeps a key for its waiting writer (readrelease.lua),
// to beat the readers it held back; at most this, a departed writer holds new readers back.
const writerReserve = time.Second

var writerReserveMillis = strconv.FormatInt(writerReserve.Milliseconds(), 10)

// refreshCall is the script and keys of a refresh of owner's hold of key.
func refreshCall(key, owner string) (*redis.Script, []string) {
	if lockstore.IsReadOwner(owner) {
		return readRefreshScript, []string{key, readersKey(key)}
	}
	return refreshScript, []string{key}
}

// acquireFair is Acquire of a fair request, with fairacquire.lua. Acquire checked the arguments.
func (s *RedisStore) acquireFair(ctx context.Context, req lockstore.Request) (lockstore.Acquisition, error) {
	key, owner, ttl := req.Key, req.Owner, req.TTL
	if lockstore.IsReadOwner(owner) {
		return lockstore.Acquisition{}, fmt.Errorf("flightlock: fair acquire %q: read holds share and keep no line", key)
	}
	keys := []string{key, lineKey(key), lineDueKey(key), lockstore.FenceKey(key)}
	args := []any{owner, ttlMillis(ttl), metaArg(req.Meta), strconv.FormatInt(req.Asked.UnixMicro(), 10), strconv.FormatInt(ttlMillis(max(req.Queue, 0)), 10)}
	taken := s.releaseOnReply(key, owner, "", acquireTaken)
	late := func(cmd *redis.Cmd) {
		// The caller left: a grant is given back, and a place left, so nobody waits behind it.
		taken(cmd)
		if code, _, _, err := reply(cmd); err == nil && code == acquireBusy {
			ctx, cancel := context.WithTimeout(context.Background(), orphanReleaseTimeout)
			defer cancel()
			_ = s.LeaveQueue(ctx, key, owner)
		}
	}
	return s.acquire(ctx, "fair acquire", fairAcquireScript, keys, args, keys[:1], owner, "", late)
}

// LeaveQueue implements lockstore.Store with leavequeue.lua.
func (s *RedisStore) LeaveQueue(ctx context.Context, key, owner string) error {
	if err := lockstore.CheckArgs(key, owner, time.Millisecond); err != nil {
		return err
	}
	keys := []string{key, lineKey(key), lineDueKey(key)}
	if err := s.run(ctx, leaveQueueScript, keys, nil, owner, s.channelPrefix).Err(); err != nil {
		return s.failed("leave the line of", key, err)
	}
	return nil
}

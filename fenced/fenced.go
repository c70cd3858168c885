// Package fenced writes to Redis only what the current holder of a lock may write: each write
// names the fence of the writer's lease (flightlock.Lease.Fence) and is applied only if that
// fence is at least the largest one that wrote the entity before, which it then stores. A
// holder that stalled (a GC pause, a partition, a failover that lost its lock) until its lock
// went to someone else carries a smaller fence than the new holder's writes, and gets
// ErrStaleFence instead of overwriting them. Fencing is what makes a lock safe beyond what
// Redis can promise; see docs/stores.md, "Failover and fencing".
//
// An entity is one Redis hash: its fields, and "lock_fence", the largest fence that wrote it.
// Each call is one script on one key, so it is atomic and works on a Redis Cluster whatever
// the key. Read the entity with HGET/HGETALL as usual (FieldFence is the reserved field).
//
//	lease, _ := locker.Lock(ctx, "sku:"+sku)
//	defer lease.Release(ctx)
//	stock, err := fenced.HIncrBy(ctx, rdb, "stock:"+sku, "units", -qty, lease.Fence(), fenced.AtLeast(0))
//
// The fence must come from the lock that protects that entity. A degraded lease (OnStoreError:
// open) has fence 0, which any fenced entity refuses once written under a real lock.
package fenced

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// FieldFence is the hash field that holds the largest fence that wrote an entity.
const FieldFence = "lock_fence"

// FieldValue is the field of the single-value entities of Set, Get and IncrBy.
const FieldValue = "value"

var (
	// ErrStaleFence means the write's fence is smaller than one that already wrote the entity:
	// the writer's lock was taken over. Nothing was changed, as it would overwrite a newer write.
	ErrStaleFence = errors.New("fenced: stale fence: the entity was written under a newer lock")
	// ErrBelowFloor means an increment would take a field below its AtLeast floor (unchanged).
	ErrBelowFloor = errors.New("fenced: the value would go below its floor")
	// ErrMissing means the field of an Existing increment does not exist. Nothing was changed.
	ErrMissing = errors.New("fenced: no such field")
)

var (
	// fenceLua is the fence comparison both scripts run, put before each of them.
	//go:embed fence.lua
	fenceLua string
	//go:embed hincrby.lua
	hincrbyLua    string
	hincrbyScript = redis.NewScript(fenceLua + hincrbyLua)
	//go:embed hset.lua
	hsetLua    string
	hsetScript = redis.NewScript(fenceLua + hsetLua)
)

// Replies of the scripts.
const (
	replyApplied = 1
	replyStale   = 0
	replyBelow   = -1
	replyMissing = -2
)

// IncrOption narrows an increment.
type IncrOption func(*incr)

type incr struct {
	floor    string // "" or the decimal lowest value
	existing string // "" or "1": refuse a missing field
}

// AtLeast refuses an increment that would take the field below floor (ErrBelowFloor): stock
// and balances that must not go negative use AtLeast(0).
func AtLeast(floor int64) IncrOption {
	return func(o *incr) { o.floor = strconv.FormatInt(floor, 10) }
}

// Existing refuses to increment a field that does not exist (ErrMissing) instead of counting
// it from 0: an unknown SKU or account is an error, not a new one.
func Existing() IncrOption {
	return func(o *incr) { o.existing = "1" }
}

// HIncrBy adds delta to the integer field of the hash key, fenced by fence, and returns the new
// value. With AtLeast, an increment below the floor returns ErrBelowFloor and the current value.
func HIncrBy(ctx context.Context, rdb redis.Scripter, key, field string, delta, fence int64, opts ...IncrOption) (int64, error) {
	if field == FieldFence {
		return 0, fmt.Errorf("fenced: %s is the fence's own field", FieldFence)
	}
	var o incr
	for _, opt := range opts {
		opt(&o)
	}
	code, n, err := pair(hincrbyScript.Run(ctx, rdb, []string{key}, field, delta, fence, o.floor, o.existing))
	if err != nil {
		return 0, fmt.Errorf("fenced: hincrby %s %s: %w", key, field, err)
	}
	switch code {
	case replyApplied:
		return n, nil
	case replyStale:
		return 0, stale(key, n, fence)
	case replyBelow:
		return n, fmt.Errorf("%w: %s %s is %d, asked to add %d (floor %s)", ErrBelowFloor, key, field, n, delta, o.floor)
	case replyMissing:
		return 0, fmt.Errorf("%w: %s %s", ErrMissing, key, field)
	}
	return 0, fmt.Errorf("fenced: hincrby %s %s: unexpected reply code %d", key, field, code)
}

// HSet sets fields of the hash key (field, value, field, value, ...), fenced by fence.
func HSet(ctx context.Context, rdb redis.Scripter, key string, fence int64, fieldValues ...string) error {
	if len(fieldValues) == 0 || len(fieldValues)%2 != 0 {
		return fmt.Errorf("fenced: hset %s: want field, value pairs, got %d strings", key, len(fieldValues))
	}
	args := append(make([]any, 0, len(fieldValues)+1), fence)
	for i, s := range fieldValues {
		if i%2 == 0 && s == FieldFence {
			return fmt.Errorf("fenced: hset %s: %s is the fence's own field", key, FieldFence)
		}
		args = append(args, s)
	}
	code, n, err := pair(hsetScript.Run(ctx, rdb, []string{key}, args...))
	if err != nil {
		return fmt.Errorf("fenced: hset %s: %w", key, err)
	}
	if code == replyStale {
		return stale(key, n, fence)
	}
	return nil
}

// Set stores value as the entity key (a hash with FieldValue and FieldFence), fenced by fence.
func Set(ctx context.Context, rdb redis.Scripter, key, value string, fence int64) error {
	return HSet(ctx, rdb, key, fence, FieldValue, value)
}

// IncrBy adds delta to the integer entity key (FieldValue), fenced by fence, as HIncrBy.
func IncrBy(ctx context.Context, rdb redis.Scripter, key string, delta, fence int64, opts ...IncrOption) (int64, error) {
	return HIncrBy(ctx, rdb, key, FieldValue, delta, fence, opts...)
}

// FieldReader reads one field of a hash: every go-redis client has it.
type FieldReader interface {
	HGet(ctx context.Context, key, field string) *redis.StringCmd
}

// Get reads the entity key of Set and IncrBy: its value and the fence that last wrote it, in
// one round trip. A missing key returns redis.Nil.
func Get(ctx context.Context, rdb redis.Cmdable, key string) (value string, fence int64, err error) {
	vals, err := rdb.HMGet(ctx, key, FieldValue, FieldFence).Result()
	if err != nil {
		return "", 0, err
	}
	v, ok := vals[0].(string)
	if !ok {
		return "", 0, redis.Nil
	}
	if f, ok := vals[1].(string); ok {
		fence, _ = strconv.ParseInt(f, 10, 64)
	}
	return v, fence, nil
}

// Fence returns the largest fence that wrote the hash key, 0 before the first fenced write.
func Fence(ctx context.Context, rdb FieldReader, key string) (int64, error) {
	f, err := rdb.HGet(ctx, key, FieldFence).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return f, err
}

func stale(key string, stored, fence int64) error {
	return fmt.Errorf("%w: %s was written with fence %d, this write has %d", ErrStaleFence, key, stored, fence)
}

// pair reads a two-integer script reply.
func pair(cmd *redis.Cmd) (int64, int64, error) {
	reply, err := cmd.Int64Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(reply) != 2 {
		return 0, 0, fmt.Errorf("unexpected reply %v", reply)
	}
	return reply[0], reply[1], nil
}

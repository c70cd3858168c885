package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// storeImpl drives flightlock's RedisStore directly, without the Locker: the same scripts,
// keys and arguments as the flightlock row, none of its client-side work (gate, hold, lease,
// watchdog). Scenario 1 runs it beside the flightlock row to split the cost of an uncontended
// lock between the store (scripts, round trips) and the Locker above it.
type storeImpl struct {
	goredisRow
	store *redisstore.RedisStore
}

func newStoreRow(addr string, s clientSetting) (impl, error) {
	c := newClient(addr, s)
	return &storeImpl{goredisRow: c, store: redisstore.New(c.client)}, nil
}

func (s *storeImpl) key(base string) string { return "fls:" + base }

func (s *storeImpl) lock(ctx context.Context, key string) (any, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	owner := hex.EncodeToString(b[:])
	a, err := s.store.Acquire(ctx, lockstore.Request{Key: key, Owner: owner, TTL: lockTTL})
	if err != nil {
		return nil, err
	}
	if !a.Acquired {
		return nil, errBusy
	}
	return owner, nil
}

func (s *storeImpl) tryLock(ctx context.Context, key string) (any, error) { return s.lock(ctx, key) }

func (s *storeImpl) unlock(ctx context.Context, key string, h any) error {
	_, err := s.store.Release(ctx, key, h.(string), "", 0)
	return err
}

func (s *storeImpl) close() { _ = s.store.Close(); _ = s.client.Close() }

package main

import (
	"context"
)

// backend is the store the commands read and change: Redis (*client) or etcd (*etcdClient).
// The commands and their printing (lockTable, lockDetail, the watcher's events) are shared;
// a backend only reads locks into lockInfo, removes one grant, and feeds a watcher.
type backend interface {
	// where names the store for messages ("10.0.0.5:6379", "etcd 10.0.0.7:2379").
	where() string
	// keyPrefix is what goes before a rendered key in the store.
	keyPrefix() string
	// list returns the held locks whose rendered key matches the Redis glob pattern, sorted by
	// key, at most limit of them (0: all) and how many more matched; shadow rules' locks only
	// with withShadow.
	list(ctx context.Context, pattern string, withShadow bool, limit int) (locks []lockInfo, more int, err error)
	// lookup reads one lock in full; errNotHeld when no one holds it.
	lookup(ctx context.Context, key string) (lockInfo, error)
	// forceUnlock removes the grant l (as lookup read it) and wakes its waiters; an error, and
	// nothing removed, when the key changed since.
	forceUnlock(ctx context.Context, l lockInfo) (unlockResult, error)
	// watch reports the changes of the locks matching w.pattern to w until ctx ends.
	watch(ctx context.Context, w *watcher) error
	close()
}

var (
	_ backend = (*client)(nil)
	_ backend = (*etcdClient)(nil)
)

func (c *client) where() string     { return c.target.where() }
func (c *client) keyPrefix() string { return c.target.prefix }

// list is scanKeys, then inspect of the first limit keys.
func (c *client) list(ctx context.Context, pattern string, withShadow bool, limit int) ([]lockInfo, int, error) {
	keys, err := c.scanKeys(ctx, pattern, withShadow)
	if err != nil {
		return nil, 0, err
	}
	more := 0
	if limit > 0 && len(keys) > limit {
		keys, more = keys[:limit], len(keys)-limit
	}
	locks, err := c.inspect(ctx, keys)
	return locks, more, err
}

package main

import (
	"strings"

	"github.com/flightlock/flightlock/lockstore"
)

// backend is the store the commands read and change, through the store's own inspector: the
// CLI reads no value of a store itself. It names the store for messages and keeps what to close.
type backend struct {
	lockstore.Inspector
	target target
	close  func()
}

// where names the store for messages ("10.0.0.5:6379", "etcd 10.0.0.7:2379",
// "zookeeper 10.0.0.9:2181 under /flightlock").
func (b *backend) where() string { return b.target.where() }

// keyPrefix is what goes before a rendered key in the store.
func (b *backend) keyPrefix() string { return b.target.keyPrefix() }

// store names the store: storeRedis, storeEtcd or storeZookeeper (the last two never show
// owner tokens).
func (b *backend) store() string { return b.target.store }

// shadowPrefix starts the keys of shadow rules (middleware: Prefix + "shadow:" + key).
const shadowPrefix = "shadow:"

// replayPrefix starts the keys of responses that share rules stored (Prefix + "replay:" +
// key): not locks, never listed.
const replayPrefix = "replay:"

// skipKeys leaves out of ls and watch the keys under the prefix that are not locks (stored
// responses) and, unless withShadow, the locks of shadow rules.
func skipKeys(withShadow bool) func(string) bool {
	return func(key string) bool {
		return strings.HasPrefix(key, replayPrefix) || !withShadow && strings.HasPrefix(key, shadowPrefix)
	}
}

// Package flightlock is a distributed lock for go-zero services that collapses contention
// inside each process before it reaches the store.
//
// A Locker takes locks on a lockstore.Store (Redis, etcd, ZooKeeper, or the embedded in-memory
// store of package lockstore/embedded for development). Per process and key, at most one goroutine
// talks to the store: the others are turned away at once (reject mode, no store command at all) or
// queue in FIFO order (wait mode), and a lock that a goroutine releases while others of its process
// wait is handed straight to the next one, without a round trip, up to a fairness bound. Each lock
// is a Lease: it carries a fencing token that only grows between owners, is renewed by a watchdog
// while held, and has a context that is cancelled with cause ErrLost as soon as the lock can no
// longer be trusted. Locks are re-entrant by context: only the outermost Release frees the key.
//
// The package and lockstore import the standard library only, and no transport: a plain
// net/http or gin service can use the Locker; package middleware wires it into go-zero REST
// and zrpc services from YAML.
package flightlock

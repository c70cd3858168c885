// Package flightlock is a distributed lock for go-zero services that collapses contention
// inside each process before it reaches Redis.
//
// A Locker takes locks on a lockstore.Store (Redis, or an embedded miniredis for development,
// package lockstore/embedded). The package and lockstore import go-redis and the standard
// library only: a plain net/http or gin service can use the Locker without go-zero.
// Per process and key, at most one goroutine talks to Redis: the others are turned away at once
// (reject mode, no Redis command at all) or queue in FIFO order (wait mode), and a lock that a
// goroutine releases while others of its process wait is handed straight to the next one,
// without a Redis round trip, up to a fairness bound. Each lock is a Lease: it carries a
// fencing token that only grows between owners, is renewed by a watchdog while held, and has a
// context that is cancelled with cause ErrLost as soon as the lock can no longer be trusted.
//
// Locks are re-entrant by context: Lock under a lease's context of the same key succeeds at
// once, and only the outermost Release frees the key.
//
// The root package imports no transport; package middleware wires it into go-zero REST and
// zrpc services from YAML.
package flightlock

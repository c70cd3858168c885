// Package etcdstore keeps flightlock's locks in etcd: the lockstore.Store (and lockstore.Passer)
// on go.etcd.io/etcd/client/v3, for endpoints where a double grant costs money even across a
// failover. Raft keeps an acknowledged grant through a leader's death, and the cluster's
// revision is a fence by construction. New takes a *clientv3.Client that the caller owns; keys
// are full etcd keys (the Locker adds its prefix). docs/guarantees.md says how each of
// flightlock's promises holds on etcd; this is what the code keeps.
//
// # Exclusion
//
// A lock is one etcd key whose value names its owner token (lockValue). Acquire is one
// transaction: a key with create revision 0 is put on the session lease, else read (a re-entry
// by the same owner, or busy with the holder's lease TTL and metadata, and a waiter mark).
// AcquireAll is a single transaction too. No write touches a key another owner holds: releases
// compare the exact revision this store wrote or read, refreshes check the owner on a read
// after the call started.
//
// # Leases and TTLs
//
// The locks of one TTL (one Locker session) ride on one etcd lease, granted on first use.
// Leases last whole seconds: other lock TTLs, and those whose lease etcd would raise to its
// minimum, are refused, never rounded. The lease of a TTL of n seconds lasts n + m seconds, m
// the lease margin (WithLeaseMargin), because the Locker counts a lock's life from the send
// time of its acquisition and etcd counts the lease's from its last keep-alive. Keep-alives go
// every m/4; an acquisition sent within m of the last one that succeeded is one transaction
// (the lease lives at least n seconds from the send), a staler one first waits for a
// keep-alive sent after it started. Refresh and RefreshAll send a keep-alive after the call
// started and check on a later read that the key is the owner's and on that lease. So every
// guarantee holds from the send time, and a dead holder's lock lasts at most n + m seconds
// after its last keep-alive. A lease etcd no longer has took every key on it: refreshes answer
// lockstore.ErrNotHeld.
//
// An acquisition whose outcome is unknown (the client gave up with its transaction on the
// wire) may commit after it was given back, leaving a key held by nobody on a lease the store
// keeps alive. So it retires its lease: later acquisitions take a new one, and the retired
// lease, kept alive for the locks on it, is revoked once no lock and no acquisition in flight
// uses it. A late commit then fails or goes with the lease.
//
// A session lease outlives any one lock, so the store gives each lock a Redis key's life: it
// remembers when its holder's guarantee runs out (send time of the last acquisition or refresh
// plus the TTL) and releases, owner-checked, every lock still there past that moment; a failed
// release is retried in the background until etcd answers (heldKey).
//
// A re-entry from another process (Reenter) keeps the holder's lease alive while it refreshes,
// so a TTL longer than that lease lasts is refused. The holder's other locks on that lease live
// as long: if its process died, until the re-entry is released, plus one lease TTL.
//
// # Faults
//
// Every call returns by its context's deadline. An acquisition rides out a leader change
// within it: one with no answer within a second, or failing with an error the cluster
// recovers from (no leader, leader changed, timeout, unavailable), is sent again, and so are
// keep-alives. Giving back a failed acquisition costs the caller no round trip (Release).
//
// A member that is cut off but keeps its connections open (frozen, behind a black hole) needs
// the client's help: the client balances calls round robin over members whose connections are
// open, so without gRPC keep-alive pings every third call goes to the silent member. Build the
// client with DialKeepAliveTime and DialKeepAliveTimeout set (etcd refuses pings more frequent
// than its --grpc-keepalive-min-time, 5s by default).
//
// # Fences and waiters
//
// Fences come from the granting transaction's revision (fence.go has the derivation and the
// exact bound). Watch fires on the key's deletion: a release, or the expiry of the holder's
// lease. A refused acquisition sets the key's waiter mark (WaiterKey, on the waiter's
// lease); the release deletes it and returns 1 when it existed, so the releasing process lets
// waiters elsewhere go first. A mark lives until the key's next release or the marking waiter's
// session ends (after an expiry, the next holder's release reports it: one needless yield).
// Across processes, the next acquiring transaction after the deletion wins, unless the
// request is fair (fair.go: a line ordered by etcd revision).
//
// # Read-write locks, fair lines and the store's own keys
//
// A read hold (lockstore.ReadOwner, readwrite.go) and a place in a fair line (a Request with
// Asked, fair.go) are keys in the lock key's side directory (sideDir), whose deletions Watch
// hears too. The store's own keys live under lockstore.FenceKeyPrefix, which the Locker and
// this store refuse as lock keys (value.go).
package etcdstore

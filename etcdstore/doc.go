// Package etcdstore keeps flightlock's locks in etcd: the lockstore.Store (and lockstore.Passer)
// on go.etcd.io/etcd/client/v3, for endpoints where a double grant costs money even across a
// failover. Raft keeps an acknowledged grant through a leader's death, and the cluster's
// revision is a fence by construction (fenceShift). New takes a *clientv3.Client that the caller
// owns; keys are full etcd keys (the Locker adds its prefix). docs/guarantees.md says how each
// of flightlock's promises holds on etcd.
//
// # Exclusion
//
// A lock is one etcd key whose value names its owner token (lockValue); every acquisition is one
// transaction. No write touches a key another owner holds: releases compare the exact revision this
// store wrote or read, refreshes check the owner on a read after the call started. Read holds and
// fair-line places (readwrite.go) live in the lock key's side directory (sideDir); the store's own
// keys live under lockstore.FenceKeyPrefix, refused as lock keys.
//
// # Leases and TTLs
//
// The locks of one TTL (one Locker session) ride on one etcd lease of TTL + margin whole
// seconds (WithLeaseMargin; other TTLs are refused, never rounded): the Locker counts a lock's
// life from its acquisition's send time, etcd the lease's from its last keep-alive. Keep-alives
// go every margin/4; an acquisition sent within the margin of the last one is one transaction,
// a staler one first waits for a keep-alive sent after it started, and refreshes send one after
// the call started (lease.go). So every guarantee holds from the send time, and a dead holder's
// lock lasts at most TTL + margin after its last keep-alive.
//
// An acquisition whose outcome is unknown may commit after it was given back, leaving a key
// held by nobody on a lease the store keeps alive. So it retires its lease: later acquisitions
// take a new one, and the retired lease is revoked once no lock and no acquisition in flight
// uses it; a late commit then fails or goes with the lease. Since a session lease outlives any
// one lock, the store releases, owner-checked, every lock whose holder's guarantee ran out
// (heldKey), retrying in the background until etcd answers.
//
// # Faults
//
// Every call returns by its context's deadline. An acquisition with no answer within a second,
// or failing with an error the cluster recovers from, is sent again (resending). A member cut
// off with its connections open needs DialKeepAliveTime and DialKeepAliveTimeout set on the
// client, or its round robin keeps sending it a share of the calls (etcd refuses pings more
// frequent than its --grpc-keepalive-min-time, 5s by default).
package etcdstore

// Package etcdstore keeps flightlock's locks in etcd: the lockstore.Store (and
// lockstore.Passer) on go.etcd.io/etcd/client/v3, for the endpoints where a double
// grant costs money even across a failover. Raft keeps an acknowledged grant
// through a leader's death, and the cluster's revision is a fence by construction.
//
// New takes a *clientv3.Client that the caller owns; keys are full etcd keys (the Locker adds
// its prefix). Only this package and the go-zero layer import etcd: the Locker does not know
// which store it drives.
//
// # Exclusion
//
// A lock is one etcd key whose value names its owner token (see lockValue). Acquire is one
// transaction: if the key's create revision is 0, put it on the session lease; else read it,
// which tells a re-entry by the same owner (idempotent: the fence of the holding, no hold
// added) from a busy key (the holder's lease TTL and metadata, and a waiter mark). AcquireAll
// (several keys, all or none) is a single transaction too. No write ever touches a key held
// by another owner: releases compare the exact revision this store wrote (or read), refreshes
// check the owner on a read after the call started.
//
// # Leases and TTLs
//
// Every lock of one TTL (one Locker session) rides on one etcd lease, granted on first use and
// kept alive in the background. etcd leases last whole seconds: a lock TTL that is not a whole
// number of seconds is refused, and so is one whose lease etcd would raise (below its minimum
// lease TTL, 1.5 election timeouts rounded up: 2s with default timings); nothing is rounded.
//
// The lease of a TTL of n seconds lasts n + m seconds, m the lease margin (WithLeaseMargin,
// 1s by default). The reason: the Locker counts a lock's life from the send time of the
// acquisition, while etcd counts the lease's from its last keep-alive. The store keeps each
// lease alive every m/4, and an acquisition sent within m of the last keep-alive that
// succeeded (the usual case) is one transaction: the lease then lives at least
// (n + m) - m = n seconds from the send. An acquisition that finds its lease staler first waits
// for a keep-alive sent after it started. Refresh and RefreshAll keep the key's lease alive
// with a keep-alive sent after the call started and check, on a read after that moment, that
// the key is still the owner's and on that lease: when they return nil the lock lives at least
// n seconds from the call. So every guarantee the Locker counts on holds from the send time,
// and a lock whose holder dies lasts at most n + m seconds after its last keep-alive.
//
// A lease that etcd no longer has (expired during a partition, revoked) took every key on it:
// refreshes answer lockstore.ErrNotHeld, and the next acquisition grants a new lease.
//
// Close stops the keep-alives and revokes only the leases that no lock is on: a lock still
// held runs out one lease TTL after its last keep-alive, as a Redis key with its TTL, since its
// holder may still run and a revocation would let a second holder in while it writes.
//
// An acquisition whose outcome is unknown (the client gave up while its transaction was on the
// wire) may commit after it was given back, and its key would then sit on the session lease,
// held by nobody, for as long as the store keeps that lease alive. So such an acquisition
// retires its lease: later acquisitions of its TTL take a new lease (one grant more), and the
// retired lease, kept alive as before for the locks on it, is revoked once no lock the store
// knows of is on it and no acquisition that chose it is still to record its outcome. A late
// commit then fails (etcd refuses a put on a revoked lease) or goes with the lease. A retired
// lease that cannot be revoked expires one lease TTL later: nothing keeps it alive any more.
//
// A session lease outlives any one lock, so the store gives each lock the life a Redis key
// would have: it remembers, per lock, the moment its holder's guarantee runs out (the send
// time of the last acquisition or refresh plus the TTL) and releases, owner-checked, every
// lock still there past that moment (one its holder lost, abandoned, or kept past MaxHold
// without refreshing, or an acquisition whose reply was lost). A release that fails is retried
// in the background until etcd answers. Without this, a release lost to a leader election
// would leave its key held for as long as the process lives.
//
// A re-entry from another process (Reenter) keeps the holder's lease alive while it refreshes,
// so a TTL longer than that lease lasts is refused. While it does, the holder's other locks on
// that lease live too: if the holder's process died, they last until the re-entry is released,
// plus one lease TTL.
//
// # Faults
//
// Every call returns by its context's deadline. An acquisition rides out a leader change
// within that deadline: one that gets no answer within a second (a proposal lost with a dead
// leader, a member that no longer answers) is sent again, and so is one that fails with an
// error the cluster recovers from (no leader, leader changed, request timed out, unavailable);
// keep-alives that get no answer are sent again likewise. The give-back of an acquisition that
// failed costs the caller no round trip: the store releases it in the background (Release).
//
// A member that is cut off but keeps its connections open (frozen, or behind a black hole)
// needs the client's help: the etcd client balances calls round robin over its members and
// keeps picking one whose connection is open, so without gRPC keep-alive pings every third
// call of the client (discovery's too) goes to the silent member, and a waiter whose attempts
// fall into step with the rotation can meet it in every attempt until its wait runs out. Build
// the client with DialKeepAliveTime and DialKeepAliveTimeout set: a member that leaves a ping
// unanswered is dropped until it answers again. etcd refuses pings more frequent than its
// --grpc-keepalive-min-time (5s by default).
//
// # Fences
//
// Fences come from the revision of the transaction that created the key, shifted left by 20
// bits, so that in-process handoffs (fence+1, fence+2, ...) stay below the next grant's, plus
// a per-key floor offset that a release writes only when a grant handed out more than 2^21
// fences. See fence.go for the derivation, the exact bound for a holder that dies without
// releasing, and the lifetime of floor keys (none are written with flightlock's default
// handoff bound).
//
// # Waking waiters
//
// Watch is an etcd watch on the key that fires on its deletion: a release, or the expiry of
// the holder's lease. An acquisition refused by another owner sets the key's waiter mark
// (WaiterKey, on the waiter's lease); the release deletes it and returns 1 when it existed, so
// the releasing process lets waiters elsewhere go first (the Locker's gate yields). A mark
// lives until the key's next release or the end of the marking waiter's session: when the
// holder's lease expires instead, the next holder's release reports it, one needless yield. Fairness across processes is that of the race to the next acquiring
// transaction after the deletion, with the releasing process yielding once to marked waiters;
// there is no queue of processes.
//
// # Read-write and fair locks
//
// The store keeps read-write locks (lockstore.ReadOwner, readwrite.go): a write lock is the
// lock key; a read hold is a key of its own in the key's side directory (one per read owner,
// on the reader's session lease, with the per-lock bookkeeping above), and a write grant
// compares that directory empty in its transaction. A writer refused by read holds sets a
// writer mark with a deadline that new read holds wait for. It keeps fair lines too
// (a lockstore.Request with Asked, fair.go): places in the key's side directory, ranked by etcd
// revision, each on a lease of the waiter's queue time. Watch hears deletions in the side
// directory too, so the end of the last read hold, and a place that leaves the line, wake the
// key's waiters.
//
// # Keys
//
// Besides the lock keys, the store writes these keys under lockstore.FenceKeyPrefix, which the
// Locker (and this store) refuse as lock keys: the fence floor (FloorKey, no lease, rare), the
// waiter mark (WaiterKey, on the waiter's lease), the writer mark (on the writer's lease), and
// each key's side directory (sideDir: "etcd/key/<length>:<key>/", whose read holds are "r/<owner>"
// and places in line "q/<owner>"); the length keeps one key's directory from being a prefix of
// another's.
package etcdstore

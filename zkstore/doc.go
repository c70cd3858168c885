// Package zkstore keeps flightlock's locks in ZooKeeper: the lockstore.Store (with
// read holds, fair lines and an Inspector) on github.com/go-zookeeper/zk, for teams whose trusted
// coordination service is a ZooKeeper ensemble. Only this package and the go-zero layer import
// ZooKeeper: the Locker does not know which store it drives.
//
// # Layout
//
// Every key is one node under the store's root, its name the key escaped so that it never
// contains a "/" (a key "orders/0" is the node "orders%2F0", beside "orders", never under it;
// see nodeName). The key node is persistent and says who holds the lock: a hash of the
// owner token (never the token itself, which would let anyone who can read the tree re-enter
// the lock), then the holder's metadata, then " ~" once someone was refused while it was held.
// The holds are ephemeral children of the key node, each on the session of the process that
// holds it and named for its owner: "o-<hash>" for the acquisition, "b-<hash>-<name>" for each
// re-entry by a handed-over owner in another process (lockstore.Store.Reenter), "r-<hash>" for
// each read hold of a read-write lock. ZooKeeper gives a key node that is deleted and created
// again the same data version, so a version alone cannot tell one grant's node from the next;
// a hold's name can: every release, renewal, re-entry and busy mark names a hold of the grant it
// read, and fails on a node the key got since.
//
// A lock is held while its key node has at least one hold. The node and its "own" hold are
// created in one transaction (multi), and the last hold and the node are deleted in one, so a
// held lock always has both. A key node without holds is what a holder's expired session left
// behind: the next acquirer deletes it (a delete of a node that has children fails, so a node
// that gained a hold meanwhile is never deleted) and takes the key.
//
// # Sessions and the lease the Locker counts on
//
// ZooKeeper has no TTL on a node: an ephemeral hold lives as long as its session, and the
// leader expires a session SessionTimeout after it last heard of it. A partitioned holder is
// told nothing until its session is gone, and a follower cut off from the quorum keeps answering
// its clients (reads and pings) for syncLimit x tickTime after it lost the leader: so nothing a
// follower says alone proves that the session still lives. What does prove it is a write the
// quorum committed: the leader checks the session before it proposes any write, and a follower
// can only forward it. So every call that grants or refreshes a hold is a multi (an acquisition
// creates nodes; a refresh is a multi of version checks, which changes nothing but goes through
// the leader), and when it succeeds the session was live at the leader after the call was sent.
// How long it lives on is counted from what the leader last heard of it: followers pass on the
// sessions their clients touched when they answer the leader's pings, and may lag up to
// syncLimit ticks before the leader drops them; this client touches its session at least every
// third of the timeout (its pings). So even a follower that lagged and was cut off just after the
// call committed had reported the session within a third of the timeout and syncLimit ticks
// before the send, and the leader expires a session on tick boundaries a timeout after its last
// report. A session seen live by a committed call therefore outlives its send by two thirds of
// the timeout less syncLimit + 1 ticks: the longest lock TTL the store accepts (MaxTTL; 14.7s
// with the 40s default session, 2s ticks and syncLimit 5). A Locker's lease, counted from the
// send of its last successful acquisition or refresh, then always ends before the session can,
// and the holder's context is cancelled first.
//
// Dial also checks the session timeout against the ensemble: the server clamps a session timeout
// to [minSessionTimeout, maxSessionTimeout] without saying so, so one outside is refused; and
// one no longer than syncLimit x tickTime plus a tick is refused, because a session must outlive
// the time a cut-off follower keeps its clients before they move to a server of the quorum, or
// one that leaves less than a second of lock TTL. The
// settings are read from the servers' "conf" four-letter word when it is allowed, and taken from
// the configuration (TickTime, SyncLimit) otherwise.
//
// # Fences
//
// A grant's fence is the creation zxid (czxid) of its key node shifted left by 16 bits: zxids
// grow with every write of the ensemble, across leader changes, so the fences of successive
// grants strictly grow, and the 16 bits leave room for 65,535 in-process handoffs under one
// grant (Capabilities.MaxHandoffs).
//
// # Calls and contexts
//
// The ZooKeeper client takes no context. Each call runs on a goroutine of its own and the caller
// returns when its context ends; an acquisition or re-entry whose answer comes after its caller
// left is given back as soon as it comes, so a timed-out Lock leaves no hold behind. A release
// that fails is retried in the background while the session lives; a hold that cannot be
// released goes with the session.
//
// Close ends the session, and ZooKeeper deletes its holds at once: drain the Lockers on the
// store first (flightlock.Locker.Drain), or their holders may still run when others get in.
package zkstore

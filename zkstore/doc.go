// Package zkstore is the lockstore.Store (read holds, fair lines, an Inspector) on ZooKeeper
// (github.com/go-zookeeper/zk). Operators read docs/stores.md; below are the code's invariants.
//
// # Layout
//
// Every key is one persistent node under the root, named by nodeName (never a "/"), whose data
// is a hash of the owner token (the token would let any reader of the tree re-enter the lock),
// the holder's metadata, and " ~" once someone was refused. The holds are ephemeral children on
// the holder's session, named for their owner: "o-<hash>" for the acquisition, "b-<hash>-<name>"
// for each re-entry from another process, "r-<hash>" for each read hold. A key node
// deleted and created again has the same data version, so only a hold's name tells one
// grant's node from the next: every release, renewal, re-entry and busy mark names a hold of
// the grant it read, and fails on a node the key got since.
//
// A lock is held while its key node has a hold. The node and its "own" hold are created in one
// multi, the last hold and the node deleted in one. A holdless key node is an expired session's:
// the next acquirer deletes it (which fails if it gained a hold meanwhile) and takes the key.
// A grant's fence is its node's creation zxid (growing across leader changes) << fenceShift.
//
// # Sessions and the lease the Locker counts on
//
// A hold lives as long as its session. A follower cut off from the quorum answers its clients
// for syncLimit x tickTime, so only a write the quorum committed proves the session lives (the
// leader checks it before proposing one): every call that grants or refreshes a hold is a
// multi (a refresh's are version checks: no change, but through the leader). This client
// touches its session every third of the timeout at least, a follower may lag syncLimit ticks
// in reporting it, and the leader expires sessions on tick boundaries: a session seen live by a
// committed call outlives its send by two thirds of the timeout less syncLimit + 1 ticks. That
// is MaxTTL, the longest TTL accepted, so a Locker's lease ends before the session can;
// checkSession refuses the timeouts this argument cannot hold for.
package zkstore

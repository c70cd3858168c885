package etcdstore

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/flightlock/flightlock/lockstore"
)

// The middleware finds a store's name and response store through Describer, at run time.
var _ lockstore.Describer = (*Store)(nil)

// Describe implements lockstore.Describer: the store as "etcd", its inspector and its response
// store, for keys under prefix (Lock.Etcd.Key + Lock.Prefix in a service).
func (s *Store) Describe(prefix string) *lockstore.Backend {
	return &lockstore.Backend{Name: "etcd", Store: s, Prefix: prefix, Inspector: NewInspector(s.cli, prefix),
		Responses: &responses{cli: s.cli, prefix: prefix, leases: make(map[int64]replayLease)}}
}

// Stored responses of share rules live under the Backend's prefix, as the rule's locks do, on
// an etcd lease, so that etcd deletes them once the rule's Replay time is over. Their life is
// rounded up to whole seconds (docs/stores.md): keeping a response a little longer is harmless,
// unlike a lock's TTL, which is refused instead.
//
// A grant is a Raft write, as costly as a save, and every live lease is work for etcd's lessor:
// so the saves of one whole-second life share one lease of that life plus replayLeaseSlack
// while it has at least the life left, then a new one is granted. Nothing revokes a lease.

// replayLeaseSlack is how much longer than the stored life each shared lease is granted: the
// window in which saves reuse it, and so the most a response may outlive its rounded life.
const replayLeaseSlack = time.Second

// replaySaveBound bounds a save (a grant, when due, and the transaction): the holder saves
// before it releases the lock, which a slow etcd must not hold longer than that (the response
// is then shared within the process only).
const replaySaveBound = time.Second

// responses keeps share rules' responses in etcd, on the lock store's client.
type responses struct {
	cli    *clientv3.Client
	prefix string // put before keys: the prefix of the rules' lock keys

	mu     sync.Mutex            // held across a grant: concurrent saves that need one wait for a single grant
	leases map[int64]replayLease // guarded by mu: the shared lease of each life, in whole seconds
}

// replayLease is the lease that the saves of one life share.
type replayLease struct {
	id    clientv3.LeaseID // 0 before the first grant
	until time.Time        // etcd expires the lease no earlier (grant sent + granted TTL)
}

func (s *responses) Load(ctx context.Context, key string) ([]byte, error) {
	kv, err := getKV(ctx, s.cli, s.prefix+key)
	if kv == nil {
		return nil, err
	}
	return kv.Value, nil
}

// Save stores record under key for at least ttl, in one transaction (see put), unless key
// holds a lock or the record of a later grant.
func (s *responses) Save(ctx context.Context, key string, record []byte, fence int64, ttl time.Duration) error {
	v := grantTag(fence) + `",` + string(record[1:]) // record is a JSON object with fields: "{...}"
	ctx, cancel := context.WithTimeout(ctx, replaySaveBound)
	defer cancel()
	secs := int64((ttl + time.Second - 1) / time.Second)
	var stale clientv3.LeaseID
	for {
		lease, err := s.lease(ctx, secs, stale)
		if err != nil {
			return err
		}
		err = s.put(ctx, s.prefix+key, v, lease, fence)
		// A lease its until said had time left is gone (revoked by an operator, lost in a
		// restore): granted anew, once.
		if stale != 0 || !isLeaseNotFound(err) {
			return err
		}
		stale = lease
	}
}

// A record in etcd starts with its grant's fence as a fixed-width string, which compares as
// bytes as it does as a number, so that a transaction can tell whether the stored record comes
// from a later grant than the saver's: {"g":"0000000000123456789",<the record's other fields>}.
// A reader ignores the field.
const (
	grantTagStart = `{"g":"`
	grantDigits   = 19 // every int64 fits
)

// grantTag is the start of a record produced under fence (0: none), up to its last digit.
func grantTag(fence int64) string {
	return fmt.Sprintf("%s%0*d", grantTagStart, grantDigits, max(fence, 0))
}

// put is Save's transaction: v under the etcd key k on lease, unless k holds a lock or the
// record of a later grant (a larger fence). Grants are compared, never write times: a holder
// that lost its lock while its handler ran may save after its successor, whose record must
// stay. A save without a fence (fail-open) or over a record without a grant tag replaces it,
// as on Redis. k holds a stored response when its value starts with '{' (between "{" and "|"),
// a later grant's when it lies in (grantTag(fence+1), grantTagStart+":"), ':' following '9'.
// etcd fails every value comparison on a missing key, hence the nested transactions.
func (s *responses) put(ctx context.Context, k, v string, lease clientv3.LeaseID, fence int64) error {
	put := clientv3.OpPut(k, v, clientv3.WithLease(lease))
	replace := []clientv3.Op{put}
	if fence > 0 && fence < math.MaxInt64 {
		replace = []clientv3.Op{clientv3.OpTxn(valueIn(k, grantTag(fence+1), grantTagStart+":"), nil, replace)}
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(put).
		Else(clientv3.OpTxn(valueIn(k, "{", "|"), replace, nil)).
		Commit()
	if err != nil || resp.Succeeded {
		return err
	}
	if len(resp.Responses) == 1 {
		if rec := resp.Responses[0].GetResponseTxn(); rec != nil {
			if !rec.Succeeded {
				return fmt.Errorf("flightlock: %s holds a lock, not a stored response", k)
			}
			if len(rec.Responses) == 1 {
				return nil // stored, or left to the later grant's record, which duplicates must get
			}
		}
	}
	return fmt.Errorf("flightlock: storing the response %s: unexpected etcd reply %v", k, resp.Responses)
}

// lease returns the shared lease of a life of secs seconds, granting one when there is none,
// it has less than secs seconds left, or it is stale (etcd no longer has it).
func (s *responses) lease(ctx context.Context, secs int64, stale clientv3.LeaseID) (clientv3.LeaseID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[secs]
	if l.id != 0 && l.id != stale && time.Until(l.until) >= time.Duration(secs)*time.Second {
		return l.id, nil
	}
	sent := time.Now()
	resp, err := s.cli.Grant(ctx, secs+int64(replayLeaseSlack/time.Second))
	if err != nil {
		return 0, fmt.Errorf("flightlock: grant the lease of stored responses: %w", err)
	}
	// etcd raises a TTL below its minimum and says so in the reply: count the granted one.
	s.leases[secs] = replayLease{id: resp.ID, until: sent.Add(time.Duration(resp.TTL) * time.Second)}
	return resp.ID, nil
}

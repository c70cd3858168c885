package share

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// record is a response as shared and stored: for REST the status, headers and body; for zrpc
// the reply message (type and bytes) or the error status. Fence is the fence of the run that
// produced it; Print the fingerprint of that request's payload.
type record struct {
	Status int         `json:"s,omitempty"` // HTTP status
	Header http.Header `json:"h,omitempty"`
	Body   []byte      `json:"b,omitempty"`  // HTTP body, or the zrpc reply's wire bytes
	Type   string      `json:"t,omitempty"`  // zrpc: the reply message's full name
	Code   int         `json:"c,omitempty"`  // zrpc: the status code of an error reply
	Msg    string      `json:"m,omitempty"`  // zrpc: its message
	St     []byte      `json:"st,omitempty"` // zrpc: its whole status (google.rpc.Status), details included
	Fence  int64       `json:"f"`
	Print  string      `json:"p"`

	replayed bool        // not stored: the record came from another run than the caller's own
	own      http.Header // not stored: every header of the leader's own response
	reply    any         // not stored: the zrpc reply the leader's handler returned
	err      error       // not stored: the zrpc error the leader's handler returned
}

// replayStore is where share rules keep responses for duplicates in other processes: the
// store the rule locks in (redisReplays here, etcdReplays in etcd.go), so that a rule
// needs no second store and its responses fail over with its locks.
type replayStore interface {
	// load returns the stored response of key, nil when there is none.
	load(ctx context.Context, key string) (*record, error)
	// save stores rec under key for at least ttl, unless key holds something that is not a
	// stored response (a lock whose key renders as this one): that is never overwritten.
	save(ctx context.Context, key string, rec *record, ttl time.Duration) error
}

// newReplayStores returns the replay store of each base Locker's store, by store name, built
// once at start-up (no I/O). etcdPrefix is put before the keys of an etcd store, as its base
// Locker puts it before lock keys (Lock.Etcd.Key). A store that cannot keep responses gets a
// replay store that refuses, with the reason: middleware.New names it for a share rule in the
// config, and a share rule built in Go on it shares within its process only, its failures logged.
func newReplayStores(bases map[string]*flightlock.Locker, etcdPrefix string) map[string]replayStore {
	stores := make(map[string]replayStore, len(bases))
	for name, base := range bases {
		switch s := base.Store().(type) {
		case *redisstore.RedisStore:
			stores[name] = &redisReplays{client: s.Client()}
		case *etcdstore.Store:
			stores[name] = newEtcdReplays(s.Client(), etcdPrefix)
		default:
			stores[name] = refusedReplays{fmt.Errorf("OnBusy share stores responses in the rule's store, "+
				"a Redis or etcd store: the lock store %T is neither", s)}
		}
	}
	return stores
}

// refusedReplays is the replay store of a lock store that cannot keep responses.
type refusedReplays struct{ err error }

func (r refusedReplays) load(context.Context, string) (*record, error) { return nil, r.err }

func (r refusedReplays) save(context.Context, string, *record, time.Duration) error { return r.err }

// decodeRecord reads the stored response v of key.
func decodeRecord(key string, v []byte) (*record, error) {
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("stored response of %q: %w", key, err)
	}
	rec.replayed = true
	return &rec, nil
}

// Scripts on the store's own client (redisstore.Client is a Scripter: GET and SET through
// one-line scripts work on every go-redis client, Cluster included; the key is the only key).
var (
	replayGet = redis.NewScript(`return redis.call('GET', KEYS[1])`)
	// replaySet never overwrites what is not a stored response (a record is JSON: '{'): a lock
	// of another rule whose key renders as this one's replay key keeps its value and its owner.
	// Nor does it replace the record of a later grant of the lock (a larger fence than ARGV[3];
	// a save without a fence, of a degraded run, compares nothing): a holder that lost its lock
	// while its handler ran must not overwrite the response of the holder after it.
	// The fence is the record's "f", which json.Marshal writes just before the last field, "p"
	// (a hex fingerprint); strings in a record are JSON-escaped, so the pattern cannot match
	// inside one.
	replaySet = redis.NewScript(`local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) ~= '{' then
  return redis.error_reply('flightlock: ' .. KEYS[1] .. ' holds a lock, not a stored response')
end
if v then
  local f = tonumber(string.match(v, '"f":(%-?%d+),"p":"[^"]*"}$') or '')
  local mine = tonumber(ARGV[3])
  if f and mine > 0 and f > mine then
    return 0
  end
end
return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`)
)

// redisReplays keeps responses in Redis, on the lock store's client.
type redisReplays struct {
	client redisstore.Client
}

func (s *redisReplays) load(ctx context.Context, key string) (*record, error) {
	v, err := replayGet.Run(ctx, s.client, []string{key}).Text()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeRecord(key, []byte(v))
}

// save stores rec under key for ttl, in milliseconds.
func (s *redisReplays) save(ctx context.Context, key string, rec *record, ttl time.Duration) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	// Bounded as the etcd save is: it runs under the lock, on a context without the request's
	// cancellation.
	ctx, cancel := context.WithTimeout(ctx, replaySaveBound)
	defer cancel()
	return replaySet.Run(ctx, s.client, []string{key}, b, max(ttl.Milliseconds(), 1), rec.Fence).Err()
}

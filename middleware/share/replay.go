package share

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
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

// replays is where share rules keep responses for duplicates in other processes: the
// response store of the store the rule locks in, so that its responses fail over with its
// locks. Keys are relative to the prefix of the rule's lock keys.
type replays struct {
	store lockstore.ResponseStore
	err   error // why the lock store keeps no responses; store is nil then
}

// newReplays returns the replays of each base Locker's store, by store name, without I/O. A
// store without a response store gets replays that refuse, with the reason (see shareParts).
func newReplays(bases map[string]*flightlock.Locker, stores map[string]lockstore.ResponseStore) map[string]replays {
	out := make(map[string]replays, len(bases))
	for name, base := range bases {
		if rs := stores[name]; rs != nil {
			out[name] = replays{store: rs}
			continue
		}
		out[name] = replays{err: fmt.Errorf("OnBusy share stores responses in the rule's store, "+
			"a Redis or etcd store: the lock store %T is neither", base.Store())}
	}
	return out
}

// load returns the stored response of key, nil when there is none.
func (r replays) load(ctx context.Context, key string) (*record, error) {
	if r.store == nil {
		return nil, r.err
	}
	v, err := r.store.Load(ctx, key)
	if err != nil || v == nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("stored response of %q: %w", key, err)
	}
	rec.replayed = true
	return &rec, nil
}

// save stores rec under key for at least ttl, unless key holds something that is not a
// stored response (a lock whose key renders as this one) or the record of a later grant.
func (r replays) save(ctx context.Context, key string, rec *record, ttl time.Duration) error {
	if r.store == nil {
		return r.err
	}
	b, err := json.Marshal(rec) // ends with "f" and "p", as lockstore.ResponseStore needs
	if err != nil {
		return err
	}
	return r.store.Save(ctx, key, b, rec.Fence, ttl)
}

package share

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
)

// record is a response as shared and stored: for REST the status, headers and body; for zrpc
// the reply message or the error status. Fence is the fence of the run that produced it, Print
// the fingerprint of that request's payload.
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
	silent   bool        // not stored: the REST handler wrote nothing
}

// cutShort reports an answer that may tell of its request's end rather than of the operation:
// a handler that wrote nothing, a 5xx, a zrpc Canceled, DeadlineExceeded or Unknown. Any other
// answer stands (a redirect, a 4xx: the operation may be done).
func (r *record) cutShort() bool {
	switch {
	case r.err != nil:
		c := codes.Code(r.Code)
		return c == codes.Canceled || c == codes.DeadlineExceeded || c == codes.Unknown
	case r.Type != "": // a zrpc reply
		return false
	}
	return r.silent || r.Status >= 500
}

// load returns the stored response of key, nil when there is none. A share rule keeps
// responses in the response store of the store it locks in, so that they fail over with its
// locks; keys are relative to the prefix of the rule's lock keys.
func (rl *rule) load(ctx context.Context, key string) (*record, error) {
	if rl.locks.Responses == nil {
		return nil, rl.locks.NoResponses
	}
	v, err := rl.locks.Responses.Load(ctx, key)
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

// save stores rec under key for at least ttl, unless key holds something else than a stored
// response (a lock whose key renders as this one) or the record of a later grant.
func (rl *rule) save(ctx context.Context, key string, rec *record, ttl time.Duration) error {
	if rl.locks.Responses == nil {
		return rl.locks.NoResponses
	}
	b, err := json.Marshal(rec) // ends with "f" and "p", as lockstore.ResponseStore needs
	if err != nil {
		return err
	}
	return rl.locks.Responses.Save(ctx, key, b, rec.Fence, ttl)
}

package middleware

import (
	"context"
	"fmt"

	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
)

// ResponseSharing is the response sharing of OnBusy share rules; nil (the default) refuses such
// a rule at start-up. A service with share rules sets it in main (see package share):
//
//	flmw.ResponseSharing = share.New // github.com/flightlock/flightlock/middleware/share
var ResponseSharing func(sharehook.Config) sharehook.Group

// responseSharingLine is the line that sets ResponseSharing, as an error names it.
const responseSharingLine = "flmw.ResponseSharing = share.New (github.com/flightlock/flightlock/middleware/share)"

// ReplayedHeader (REST) and ReplayedMetadata (zrpc response header metadata) mark a response a
// duplicate received from the request that ran the handler, as payment APIs mark replays.
const (
	ReplayedHeader   = sharehook.ReplayedHeader
	ReplayedMetadata = sharehook.ReplayedMetadata
)

// ErrPayloadMismatch answers a request of an OnBusy share rule whose key was used by a request
// with another payload: 422 / InvalidArgument, as the IETF Idempotency-Key draft says.
var ErrPayloadMismatch = sharehook.ErrPayloadMismatch

// shareParts gives the parts of cr, a rule locking in store, their response sharing if its
// OnBusy is share: an error without ResponseSharing, and, when strict, on a store keeping no
// responses (a Route rule on one shares within its process only).
func (m *Middleware) shareParts(cr *compiledRule, field, store string, strict bool) error {
	if cr.spec.OnBusy != rules.OnBusyShare {
		return nil
	}
	if m.sharing == nil {
		return rules.FieldError(field+".OnBusy", "is share, and this binary does not link response sharing: "+
			"add %s to the service's main.go", responseSharingLine)
	}
	responses := m.responses[store]
	var noResponses error
	if responses == nil {
		noResponses = fmt.Errorf("OnBusy share stores responses in the rule's store, "+
			"a Redis or etcd store: the lock store %T is neither", m.bases[store].Store())
		if strict {
			return rules.FieldError(field+".OnBusy", "%v", noResponses)
		}
	}
	for _, rl := range cr.parts() {
		locks := sharehook.Locks{Responses: responses, NoResponses: noResponses,
			Lock:        func(ctx context.Context, keys []string) (sharehook.Held, error) { return m.lock(ctx, rl, keys, nil) },
			Release:     func(ctx context.Context, h sharehook.Held) { m.release(ctx, rl, h) },
			LogError:    func(ctx context.Context, what string, err error) { m.logs.error(ctx, rl.stats, what, err) },
			CountShared: func(how string) { rl.stats.count(sharedTotal, how) },
		}
		rl.share = m.sharing.Rule(locks, cr.spec.Rule, rl.Plan)
	}
	return nil
}

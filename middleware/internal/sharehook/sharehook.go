// Package sharehook connects the middleware to response sharing (OnBusy share), which
// middleware/share implements and a service's main hands to middleware.ResponseSharing, so
// that only the binaries that use it link it; share never depends on the middleware.
package sharehook

import (
	"context"
	"errors"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/middleware/rules"
)

// ReplayedHeader and ReplayedMetadata are middleware.ReplayedHeader and ReplayedMetadata.
const (
	ReplayedHeader   = "Idempotent-Replayed"
	ReplayedMetadata = "idempotent-replayed"
)

// ErrPayloadMismatch is middleware.ErrPayloadMismatch.
var ErrPayloadMismatch = errors.New("flightlock: this key was used by a request with a different payload")

// Config is what the response sharing of one Middleware is built from.
type Config struct {
	Wait time.Duration // LockConf.Wait: the wait of a share rule without one of its own
	// HTTPError and RPCError answer a failed request as the middleware answers its own errors.
	HTTPError func(w http.ResponseWriter, r *http.Request, err error)
	RPCError  func(err error) error
}

// Group is the response sharing of one Middleware; Rule returns that of one transport's part
// of a share rule r (normalized), keyed by plan, that locks through locks.
type Group interface {
	Rule(locks Locks, r rules.Rule, plan *rules.Plan) Rule
}

// Rule serves the requests of one share rule, for one transport, with keys rendered.
type Rule interface {
	HandleHTTP(w http.ResponseWriter, r *http.Request, next http.HandlerFunc, keys []string)
	HandleRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler, keys []string) (any, error)
}

// Locks is what sharing needs of the middleware for one rule.
type Locks struct {
	// Lock and Release take and release the rule's lock as for any rule (measured, traced,
	// logged); Release ignores ctx's cancellation.
	Lock    func(ctx context.Context, keys []string) (Held, error)
	Release func(ctx context.Context, h Held)
	// Responses keeps responses for duplicates in other processes, in the store the rule
	// locks in; nil when that store keeps none, and NoResponses then says why: the rule
	// shares within its process only, its failures logged.
	Responses   lockstore.ResponseStore
	NoResponses error
	// LogError logs that what failed because of err, at most once an interval per rule and what.
	LogError func(ctx context.Context, what string, err error)
	// CountShared counts a request answered without a run of its own, by where the response
	// came from ("inflight", "stored"), or a response too large to store ("too_large").
	CountShared func(how string)
}

// Held is the lock a request holds, from the middleware's lock to its release.
type Held struct {
	// Group is the request's leases, one per key; nil only when a shadow rule ran the handler
	// without its lock (a share rule is never a shadow rule).
	Group *flightlock.Group
	Ctx   context.Context // the handler's context: the lease's, or the request's for a shadow rule
	At    time.Time       // when the lock was granted
}

package app

import "github.com/zeromicro/go-zero/rest"

// Option changes how New assembles the System. main uses none; they exist for tests and for
// the HTTP benchmark (bench/, scenario 6), which compares the order API's own lock with no
// lock and with another library's.
type Option func(*options)

type options struct {
	replaceOrderLock bool
	orderLock        rest.Middleware // nil with replaceOrderLock: no lock at all
}

// WithOrderLock replaces the order API's flightlock middleware (the rules of Order.Lock) with
// mw, installed with server.Use in its place, so it sees every route of the API; a nil mw
// means no lock at all, as WithoutOrderLock. The services the order API calls keep their own
// flightlock interceptors, and no lock owner is propagated to them.
//
// Without a flightlock lease in the request, create-order writes the order book with fence 0:
// the writes are not fenced, and the order book of a uid that a fenced order already wrote
// refuses them (409). For measurements only: use uids of their own.
func WithOrderLock(mw rest.Middleware) Option {
	return func(o *options) { o.replaceOrderLock, o.orderLock = true, mw }
}

// WithoutOrderLock runs the order API with no lock at all, as WithOrderLock with a middleware
// that does nothing would: duplicate orders are no longer rejected. For measurements only.
func WithoutOrderLock() Option {
	return WithOrderLock(nil)
}

// Package devhook carries the embedded in-memory store from the devstore package, which a
// development binary imports, to the middleware, which must not link it into every service.
package devhook

import "github.com/flightlock/flightlock/lockstore/redisstore"

// Open starts an embedded in-memory store; nil unless middleware/devstore is linked in.
var Open func(opts ...redisstore.Option) (*redisstore.RedisStore, error)

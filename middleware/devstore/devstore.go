// Package devstore links the embedded in-memory Redis into a service, for development: with it,
// a LockConf without Lock.Redis.Host (and without an etcd store) runs on an in-process
// miniredis that only this process sees, and the middleware logs that at error level. Import
// it for its side effect, in the main package of a development or test binary only:
//
//	import _ "github.com/flightlock/flightlock/middleware/devstore"
//
// Without it, such a config is refused at start-up with an error that names this import, and
// production binaries link neither miniredis nor its Lua interpreter.
package devstore

import (
	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/flightlock/flightlock/middleware/internal/devhook"
)

func init() { devhook.Open = embedded.New }

package zktest

import (
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// Connect returns a go-zookeeper client on addrs (a server's Addr, Ensemble.Addrs, or proxies in
// front of them) once it has a session, with its events, and closes it when tb ends. It logs
// nothing: a test that kills servers would otherwise fill its output with reconnection lines.
// The events channel holds a few events that nobody reads and drops later ones (go-zookeeper's
// rule), so a test that watches the session reads it from the start.
func Connect(tb testing.TB, sessionTimeout time.Duration, addrs ...string) (*zk.Conn, <-chan zk.Event) {
	tb.Helper()
	c, events, err := zk.Connect(addrs, sessionTimeout, zk.WithLogger(quiet{}), zk.WithLogInfo(false))
	if err != nil {
		tb.Fatalf("zktest: connect to %v: %v", addrs, err)
	}
	tb.Cleanup(c.Close)
	deadline := time.Now().Add(readyTimeout)
	for c.State() != zk.StateHasSession {
		if time.Now().After(deadline) {
			tb.Fatalf("zktest: no session on %v after %v (state %v)", addrs, readyTimeout, c.State())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c, events
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

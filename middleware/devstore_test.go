package middleware

import (
	"strings"
	"testing"

	_ "github.com/flightlock/flightlock/middleware/devstore" // the embedded store, as a dev binary links it
	"github.com/flightlock/flightlock/middleware/internal/devhook"
)

// A config with no store that runs in a binary without the embedded store is refused at
// start-up, and the error names the import that links it; with the import, it runs.
func TestEmptyHostWithoutDevstoreNamesTheImport(t *testing.T) {
	conf := LockConf{Rules: []Rule{{Method: "POST", Path: "/order", Key: "order:{header.x-uid}"}}}
	open := devhook.Open
	devhook.Open = nil
	_, err := New(conf)
	devhook.Open = open
	if err == nil || !strings.Contains(err.Error(), devstoreImport) || !strings.Contains(err.Error(), "Lock.Redis.Host") {
		t.Fatalf("New without a Redis host or the embedded store: %v, want an error naming Lock.Redis.Host and %s", err, devstoreImport)
	}
	m, err := New(conf)
	if err != nil {
		t.Fatalf("New without a Redis host, the embedded store linked: %v", err)
	}
	_ = m.Close()
}

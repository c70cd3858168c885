package middleware

import (
	"strings"
	"testing"
)

// A config with no store that runs in a binary without the embedded store is refused at
// start-up, and the error names the line that sets it (EmbeddedStore); with it set, it runs.
func TestEmptyHostWithoutTheEmbeddedStoreNamesTheLineThatSetsIt(t *testing.T) {
	conf := LockConf{Rules: []Rule{{Method: "POST", Path: "/order", Key: "order:{header.x-uid}"}}}
	open := EmbeddedStore
	EmbeddedStore = nil
	_, err := New(conf)
	EmbeddedStore = open
	if err == nil || !strings.Contains(err.Error(), embeddedStoreLine) || !strings.Contains(err.Error(), "Lock.Redis.Host") {
		t.Fatalf("New without a Redis host or the embedded store: %v, want an error naming Lock.Redis.Host and %s", err, embeddedStoreLine)
	}
	m, err := New(conf)
	if err != nil {
		t.Fatalf("New without a Redis host, the embedded store linked: %v", err)
	}
	_ = m.Close()
}

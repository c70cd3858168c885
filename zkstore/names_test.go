package zkstore

import (
	"strings"
	"testing"
	"time"
)

// Keys become one node name each, never a path of several: "orders/0" is a sibling of
// "orders", and every name reads back as its key.
func TestKeysBecomeOneNodeNameEachAndReadBack(t *testing.T) {
	keys := []string{"orders", "orders/0", "lock:orders/0/items", ".", "..", "%2F", "a b\x00c\xff", "zookeeper", "ключ", "x.line"}
	seen := map[string]string{}
	for _, k := range keys {
		n := nodeName(k)
		if strings.ContainsAny(n, "/.") || n == "" {
			t.Errorf("nodeName(%q) = %q: a path separator or dot, or empty", k, n)
		}
		if back, ok := keyOf(n); !ok || back != k {
			t.Errorf("keyOf(nodeName(%q)) = %q, %v", k, back, ok)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("%q and %q share the node name %q", prev, k, n)
		}
		seen[n] = k
	}
	if _, ok := keyOf("orders.line"); ok {
		t.Error("a fair line's node name read as a key")
	}
}

func FuzzNodeNameReadsBack(f *testing.F) {
	f.Add("orders/0")
	f.Fuzz(func(t *testing.T, k string) {
		n := nodeName(k)
		if back, ok := keyOf(n); !ok || back != k || strings.ContainsAny(n, "/.") {
			t.Fatalf("nodeName(%q) = %q reads back as %q, %v", k, n, back, ok)
		}
	})
}

// A session timeout the servers would clamp, or that a cut-off follower's clients cannot
// outlive, is refused with the figures that decide it; a good one leaves two thirds less two
// ticks for the lock TTL.
func TestSessionTimeoutIsCheckedAgainstTheEnsemble(t *testing.T) {
	ens := ensemble{tick: 500 * time.Millisecond, syncLimit: 5, minSession: time.Second, maxSession: 20 * time.Second, fromServer: "127.0.0.1:2181"}
	for _, tc := range []struct {
		session time.Duration
		want    string
	}{
		{0, "must be positive"},
		{500 * time.Millisecond, "outside the servers' 1s to 20s"},
		{time.Minute, "outside the servers' 1s to 20s"},
		{3 * time.Second, "not longer than syncLimit x tickTime + tickTime = 3s (read from 127.0.0.1:2181)"},
	} {
		err := checkSession(tc.session, ens)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("session %v: %v, want an error with %q", tc.session, err, tc.want)
		}
	}
	if err := checkSession(9*time.Second, ens); err != nil {
		t.Errorf("a 9s session with 500ms ticks: %v", err)
	}
	if got := maxTTL(9*time.Second, 500*time.Millisecond, 5); got != 3*time.Second {
		t.Errorf("maxTTL(9s, 500ms, syncLimit 5) = %v, want 3s", got)
	}
	if err := checkSession(4*time.Second, ens); err == nil || !strings.Contains(err.Error(), "less than a second of lock TTL") {
		t.Errorf("a 4s session with 500ms ticks and syncLimit 5: %v, want refused for leaving no lock TTL", err)
	}
}

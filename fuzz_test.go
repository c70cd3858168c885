package flightlock

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// Any key is either refused with ErrInvalidKey (empty, too long) or locked under exactly
// prefix+key and released without leaving anything behind.
func FuzzLockKey(f *testing.F) {
	for _, k := range []string{"", "a", "order:42", "\x00\xff", "a\nb", "ключ:🔒", "{x}", strings.Repeat("k", MaxKeyLen)} {
		f.Add(k)
	}
	s := newMemStore()
	l := MustNew(s, WithMode(Reject))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, key string) {
		lease, err := l.Lock(ctx, key)
		valid := key != "" && len(DefaultPrefix)+len(key) <= MaxKeyLen
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) || valid {
				t.Fatalf("Lock(%q) = %v", key, err)
			}
			return
		}
		if !valid {
			t.Fatalf("Lock(%q) accepted an invalid key", key)
		}
		if lease.Key() != DefaultPrefix+key {
			t.Fatalf("locked %q for key %q", lease.Key(), key)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if s.size() != 0 || l.gateLen() != 0 {
			t.Fatalf("key %q left %d locks and %d gate entries", key, s.size(), l.gateLen())
		}
	})
}

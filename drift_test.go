package flightlock

import (
	"context"
	"sync"
	"testing"
)

// driftLog collects Observer.Drift reports.
type driftLog struct {
	mu   sync.Mutex
	seen []string // "key here holder"
}

func (d *driftLog) observer() Observer {
	return Observer{Drift: func(_ context.Context, key, here, holder string) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.seen = append(d.seen, here+" "+holder)
	}}
}

func (d *driftLog) reports() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.seen...)
}

// Two processes that lock one key in ways that cannot be one rule's (another permit count, a
// lock beside a semaphore, a fair lock beside an unfair one) notice it from the store: the kind
// travels with the grant, and a Lock that finds the key held by another kind reports drift.
// Kinds that are one rule's (a semaphore of one count, a read beside a write) report nothing.
func TestDriftBetweenProcessesIsReportedFromTheStore(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		holder     []Option
		taker      []Option
		want       string // "" for no drift
		takerLooks int
	}{
		{"fair beside unfair", nil, []Option{WithFair()}, "fair lock", 1},
		{"unfair beside fair", []Option{WithFair()}, nil, "lock fair", 1},
		{"semaphore beside a lock", nil, []Option{WithPermits(2)}, "permits:2 lock", 2},
		{"a lock beside a semaphore", []Option{WithPermits(2)}, nil, "lock permits:2", 1},
		{"two counts", []Option{WithPermits(3)}, []Option{WithPermits(2)}, "permits:2 permits:3", 2},
		{"one count", []Option{WithPermits(2)}, []Option{WithPermits(2)}, "", 2},
		{"a read beside a lock", nil, []Option{WithRead()}, "", 1},
		{"a lock beside a read", []Option{WithRead()}, nil, "", 1},
		{"one kind", nil, nil, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := miniStore(t)
			holder := mustLocker(t, s, append([]Option{WithMode(Reject)}, tc.holder...)...)
			// Every permit of a semaphore, so that the taker meets one whichever it looks at.
			for range max(holder.cfg.permits, 1) {
				held, err := holder.Lock(ctx, "t")
				if err != nil {
					t.Fatal(err)
				}
				defer held.Release(ctx)
			}
			var d driftLog
			taker := mustLocker(t, s, append([]Option{WithMode(Reject), WithObserver(d.observer())}, tc.taker...)...)
			for range tc.takerLooks { // a semaphore's look starts at a rotating permit
				if lease, err := taker.Lock(ctx, "t"); err == nil {
					defer lease.Release(ctx)
				}
			}
			got := d.reports()
			switch {
			case tc.want == "" && len(got) != 0:
				t.Fatalf("drift reported %q, want none", got)
			case tc.want != "" && (len(got) == 0 || got[0] != tc.want):
				t.Fatalf("drift reports %q, want %q", got, tc.want)
			}
		})
	}
}

// The kind is read from the holder's metadata as the stores keep it, after the holder's own
// fields; metadata of a holder that wrote none names no kind.
func TestHolderKindIsReadFromTheMetadata(t *testing.T) {
	for meta, want := range map[string]string{
		"host=a pid=1 kind=permits:3":    "kind=permits:3",
		"host=a pid=1 trace=x kind=fair": "kind=fair",
		"host=a pid=1":                   "",
		"host=a pid=1 note=mykind=lock":  "",
		"kind=read":                      "kind=read",
	} {
		if got := holderKind(meta); got != want {
			t.Errorf("holderKind(%q) = %q, want %q", meta, got, want)
		}
	}
}

// A Locker's Kind names its locks as the drift reports and the stores' metadata do, and a
// Locker derived with With keeps its kind unless the options change it.
func TestKindNamesWhatALockersLocksAre(t *testing.T) {
	s, _, _ := miniStore(t)
	for _, tc := range []struct {
		opts []Option
		want string
	}{
		{nil, "lock"},
		{[]Option{WithMode(Reject), WithFailOpen(true)}, "lock"},
		{[]Option{WithRead()}, "read"},
		{[]Option{WithFair()}, "fair"},
		{[]Option{WithPermits(3)}, "permits:3"},
	} {
		l := MustNew(s, tc.opts...)
		if got := l.Kind(); got != tc.want {
			t.Errorf("Kind of a Locker with %d options = %q, want %q", len(tc.opts), got, tc.want)
		}
		derived, err := l.With(WithPrefix("other:"))
		if err != nil {
			t.Fatal(err)
		}
		if got := derived.Kind(); got != tc.want {
			t.Errorf("Kind after With(WithPrefix) = %q, want %q as before", got, tc.want)
		}
	}
}

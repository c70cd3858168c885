package flightlock

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// A lease that is never released is reported once its lock has run out: the Observer hears the
// key and where the lease was taken (this file's TryLock line), and a lease released in time
// is never reported.
func TestLeaseNeverReleasedIsReportedWithWhereItWasTaken(t *testing.T) {
	s, _, _ := miniStore(t)
	clk := newManualClock()
	const ttl, maxHold = 3 * time.Second, 5 * time.Second
	type report struct{ key, at string }
	reports := make(chan report, 4)
	l := mustLocker(t, s, WithTTL(ttl), WithMaxHold(maxHold), withClock(clk), WithObserver(Observer{
		Abandoned: func(key, at string) { reports <- report{key, at} },
	}))
	ctx := context.Background()

	released, err := l.TryLock(ctx, "job:tidy")
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, line, _ := runtime.Caller(0)
	_, err = l.TryLock(ctx, "job:interest") // never released
	if err != nil {
		t.Fatal(err)
	}
	_, _, groupLine, _ := runtime.Caller(0)
	if _, err := l.LockAll(ctx, "job:fees"); err != nil { // never released either
		t.Fatal(err)
	}
	permits, err := l.With(WithPermits(2))
	if err != nil {
		t.Fatal(err)
	}
	_, _, permitLine, _ := runtime.Caller(0)
	permit, err := permits.Lock(ctx, "job:export") // a permit, never released
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"lock:job:interest": fmt.Sprintf("leak_test.go:%d ", line+1),
		"lock:job:fees":     fmt.Sprintf("leak_test.go:%d ", groupLine+1),
		permit.Key():        fmt.Sprintf("leak_test.go:%d ", permitLine+1),
	}
	// Step past MaxHold and the last renewal's TTL, a renewal interval at a time, so that the
	// watchdog renews until MaxHold, then loses the lock, then gives the grant up.
	for range int((maxHold + 2*ttl) / (ttl / 3)) {
		clk.Advance(ttl / 3)
		time.Sleep(time.Millisecond)
	}
	for len(want) > 0 {
		select {
		case r := <-reports:
			if w, ok := want[r.key]; !ok || !strings.Contains(r.at, w) {
				t.Errorf("reported %q taken at %q, want one of %v", r.key, r.at, want)
			}
			delete(want, r.key)
		case <-time.After(5 * time.Second):
			t.Fatalf("leases never released and not reported: %v", want)
		}
	}
	select {
	case r := <-reports:
		t.Errorf("a second report: %+v (the released lease, or the same one twice)", r)
	case <-time.After(50 * time.Millisecond):
	}
}

// Without an Observer that hears it, the report is an error log line (log/slog) with the key
// and the place.
func TestLeaseNeverReleasedIsLoggedWithoutAnObserver(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	s, _, _ := miniStore(t)
	clk := newManualClock()
	const ttl = 3 * time.Second
	l := mustLocker(t, s, WithTTL(ttl), WithMaxHold(ttl), withClock(clk))
	if _, err := l.Lock(context.Background(), "job:leaked"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the error log line", func() bool {
		clk.Advance(ttl / 3)
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(buf.String(), "level=ERROR")
	})
	mu.Lock()
	line := buf.String()
	mu.Unlock()
	if !strings.Contains(line, "lock:job:leaked") || !strings.Contains(line, "leak_test.go:") {
		t.Errorf("log line %q, want the key and leak_test.go:<line>", line)
	}
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

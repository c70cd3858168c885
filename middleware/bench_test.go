package middleware

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// instantStore grants every acquisition at once and keeps nothing: the benchmark and guard
// below then measure the middleware and the Locker, not a store's I/O.
type instantStore struct{ fence atomic.Int64 }

func (s *instantStore) Capabilities() lockstore.Capabilities { return lockstore.Capabilities{} }

func (s *instantStore) RefreshAll(_ context.Context, batch []lockstore.Renewal) []error {
	return make([]error, len(batch))
}

func (s *instantStore) LeaveQueue(context.Context, string, string) error { return nil }

func (s *instantStore) Acquire(context.Context, lockstore.Request) (lockstore.Acquisition, error) {
	return lockstore.Acquisition{Acquired: true, Fence: s.fence.Add(1)}, nil
}

func (s *instantStore) Reenter(context.Context, string, string, string, time.Duration) (lockstore.Acquisition, error) {
	return lockstore.Acquisition{}, nil
}

func (s *instantStore) Refresh(context.Context, string, string, time.Duration) error { return nil }

func (s *instantStore) Release(context.Context, string, string, string, int64) (int, error) {
	return 0, nil
}

func (s *instantStore) TTL(context.Context, string) (time.Duration, error) { return time.Minute, nil }

func (s *instantStore) Watch(context.Context, string) (*lockstore.Watch, error) {
	return nil, errors.New("instantStore: no release notifications")
}

const orderBody = `{"uid":"u12345","sku":"s1","qty":1}`

// orderRequest runs one POST /api/order/create with a JSON body through h.
func orderRequest(h http.HandlerFunc) int {
	r := httptest.NewRequest(http.MethodPost, "/api/order/create", strings.NewReader(orderBody))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h(w, r)
	return w.Code
}

func orderHandlers(tb testing.TB) (bare, locked http.HandlerFunc) {
	tb.Helper()
	m, err := New(LockConf{Rules: []Rule{{Method: http.MethodPost, Path: "/api/order/create",
		Key: "order:{body.uid}", OnBusy: "reject"}}}, WithStore(&instantStore{}))
	if err != nil {
		tb.Fatal(err)
	}
	bare = func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }
	return bare, m.Handle(bare)
}

// BenchmarkRESTRequest is the middleware's own cost per request (bench/, scenario 6): a
// request keyed by its JSON body through a reject rule on a store that answers at once, beside
// the same request without the middleware. The difference is what flightlock adds to a
// request's CPU besides the store's round trips.
func BenchmarkRESTRequest(b *testing.B) {
	bare, locked := orderHandlers(b)
	for _, c := range []struct {
		name string
		h    http.HandlerFunc
	}{{"bare", bare}, {"locked", locked}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if code := orderRequest(c.h); code != http.StatusOK {
					b.Fatalf("status %d", code)
				}
			}
		})
	}
}

// allocsPerLockedRequest bounds what the middleware adds to a request's allocations, as in
// BenchmarkRESTRequest: rule matching, the body key, the lock and its release, metrics.
// 50 (51 under -race), with the body's JSON decoded in one pass; two decoders make 56 (57).
// A change that adds allocations fails here.
const allocsPerLockedRequest = 51

func TestAllocsPerLockedRequest(t *testing.T) {
	bare, locked := orderHandlers(t)
	for range 64 { // first-use allocations of the Locker, the gate and the metrics
		if code := orderRequest(locked); code != http.StatusOK {
			t.Fatalf("status %d", code)
		}
	}
	base := testing.AllocsPerRun(500, func() { orderRequest(bare) })
	got := testing.AllocsPerRun(500, func() { orderRequest(locked) })
	added := got - base
	t.Logf("a locked request allocates %v times, %v without the middleware: %v added (bound %d)", got, base, added, allocsPerLockedRequest)
	if added > allocsPerLockedRequest {
		t.Errorf("the middleware adds %v allocations per request, bound %d: find the new allocation, or raise the bound and say why", added, allocsPerLockedRequest)
	}
}

package middleware

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/rest"
)

// WithStore builds the Locker from the LockConf on a shared store, and every lock it takes
// names its holder (host, pid) next to the owner token for operators.
func TestWithStoreUsesConfAndRecordsHolder(t *testing.T) {
	tr := newTestRedis(t)
	m, err := New(LockConf{Prefix: "svc:", Rules: []Rule{{Method: http.MethodPost, Path: "/p/:id", Key: "id:{id}"}}},
		WithStore(tr.store))
	if err != nil {
		t.Fatal(err)
	}
	var value string
	s := serverless(t, restConf(t, time.Second), m, []rest.Route{{Method: http.MethodPost, Path: "/p/:id",
		Handler: func(w http.ResponseWriter, r *http.Request) { value, _ = tr.mr.Get("svc:id:7") }}})
	rec := serve(s, httptest.NewRequest(http.MethodPost, "/p/7", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d", rec.Code)
	}
	if want := fmt.Sprintf(" pid=%d", os.Getpid()); !strings.Contains(value, " host=") || !strings.Contains(value, want) {
		t.Fatalf("lock value %q does not name its holder", value)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	// Close leaves a store given with WithStore open.
	if _, err := tr.store.TTL(context.Background(), "svc:none"); err != nil && !strings.Contains(err.Error(), "not held") {
		t.Fatalf("store closed by Middleware.Close: %v", err)
	}
}

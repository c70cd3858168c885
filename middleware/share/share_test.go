package share

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/lockstore/redisstore"
	"github.com/flightlock/flightlock/middleware/internal/sharehook"
)

// save refuses to replace the stored response of a later grant (a larger fence) and
// replaces one of an earlier grant: the save of a holder that lost its lock after lead looked
// cannot overwrite its successor's.
func TestSaveKeepsTheLaterGrantsRecord(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: 2, DisableIdentity: true})
	defer client.Close()
	ctx := context.Background()
	store := redisstore.New(client)
	defer store.Close()
	rp := &rule{locks: sharehook.Locks{Responses: store.Describe("").Responses}}
	save := func(fence int64, body string) {
		t.Helper()
		if err := rp.save(ctx, "lock:replay:k", &record{Status: 200, Header: http.Header{"X-F": {`"f":1,"p":"x"}`}},
			Body: []byte(body), Fence: fence, Print: "abc"}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() string {
		t.Helper()
		rec, err := rp.load(ctx, "lock:replay:k")
		if err != nil || rec == nil {
			t.Fatalf("load: %v, %v", rec, err)
		}
		return string(rec.Body)
	}
	save(10, "ten")
	save(5, "five")
	if got := stored(); got != "ten" {
		t.Errorf("a record of fence 5 replaced one of fence 10: stored %q", got)
	}
	save(12, "twelve")
	if got := stored(); got != "twelve" {
		t.Errorf("a record of fence 12 did not replace one of fence 10: stored %q", got)
	}
}

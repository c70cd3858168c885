package flightlock

import (
	"context"
	"os"
	"strconv"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// A core Locker built with no options writes its holder's host and pid beside the owner token
// (DefaultMetadata), so that `flightlock show` names the process of a job's lock too; the core
// reads no trace (the go-zero layer adds it); WithMetadata(nil) stores nothing.
func TestCoreLocksCarryHostAndPid(t *testing.T) {
	store, _, client := miniStore(t)
	inspect := redisstore.NewInspector(client, "lock:")
	traceID := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}))
	host, _ := os.Hostname()

	lease, err := mustLocker(t, store).Lock(ctx, "job:interest")
	if err != nil {
		t.Fatal(err)
	}
	info, err := inspect.Lookup(context.Background(), "job:interest")
	if err != nil {
		t.Fatal(err)
	}
	if info.Host != host || info.Pid != strconv.Itoa(os.Getpid()) || info.Trace != "" {
		t.Errorf("holder host=%q pid=%q trace=%q, want %q %d and no trace", info.Host, info.Pid, info.Trace, host, os.Getpid())
	}
	_ = lease.Release(context.Background())

	lease, err = mustLocker(t, store, WithMetadata(nil)).Lock(context.Background(), "job:quiet")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	if info, err := inspect.Lookup(context.Background(), "job:quiet"); err != nil || info.Host != "" || info.Pid != "" {
		t.Errorf("WithMetadata(nil): holder %+v, %v; want no host or pid", info, err)
	}
}

package flightlock

import (
	"context"
	"errors"
	"testing"
	"time"
)

type valueKey struct{}

// The shared bound keeps each call's deadline within [limit - span/16, limit], shares one
// context between calls of the same window, keeps the caller's values, and ends with
// DeadlineExceeded as a context of its own would.
func TestSharedBoundDeadlines(t *testing.T) {
	const span = 160 * time.Millisecond
	b := &sharedBound{span: span}
	caller := context.WithValue(context.Background(), valueKey{}, "span-1")

	now := time.Now()
	first := b.bound(caller, now, now.Add(span))
	second := b.bound(context.Background(), now, now.Add(span+span/32)) // same window
	third := b.bound(context.Background(), now, now.Add(span+span/8))   // too far: a new window

	for i, tc := range []struct {
		ctx   context.Context
		limit time.Time
	}{{first, now.Add(span)}, {second, now.Add(span + span/32)}, {third, now.Add(span + span/8)}} {
		d, ok := tc.ctx.Deadline()
		if !ok {
			t.Fatalf("call %d: no deadline", i)
		}
		if d.After(tc.limit) || tc.limit.Sub(d) > span/16 {
			t.Errorf("call %d: deadline %v before its limit, want within [0, %v]", i, tc.limit.Sub(d), span/16)
		}
	}
	if first.(*boundCtx).Context != second.(*boundCtx).Context {
		t.Error("two calls of one window got two timer contexts")
	}
	if second.(*boundCtx).Context == third.(*boundCtx).Context {
		t.Error("a call whose limit is span/8 later shares the earlier window: it would end too soon")
	}
	// Near the end of a wait budget, a call keeps nearly all of what is left: 60ms left, and a
	// window that ends 50ms before its limit is not shared with it.
	wait := &sharedBound{span: 2 * time.Second}
	start := time.Now()
	early := wait.bound(context.Background(), start, start.Add(2*time.Second))
	late := wait.bound(context.Background(), start.Add(1990*time.Millisecond), start.Add(2050*time.Millisecond))
	if early.(*boundCtx).Context == late.(*boundCtx).Context {
		t.Error("a call with 60ms left shares a window that ends 50ms before its limit")
	}
	if d, _ := late.Deadline(); !d.Equal(start.Add(2050 * time.Millisecond)) {
		t.Errorf("late call's deadline %v after start, want its limit 2.05s", d.Sub(start))
	}

	if got := first.Value(valueKey{}); got != "span-1" {
		t.Errorf("caller's value lost: got %v", got)
	}
	if got := second.Value(valueKey{}); got != nil {
		t.Errorf("a value leaked between calls sharing a window: got %v", got)
	}

	// A context derived from it is cancelled with it (found through Value, not a goroutine).
	derived, cancel := context.WithCancel(first)
	defer cancel()
	select {
	case <-first.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the shared context never ended")
	}
	select {
	case <-derived.Done():
	case <-time.After(time.Second):
		t.Fatal("a context derived from a bound call was not cancelled with it")
	}
	if !errors.Is(first.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(first), context.DeadlineExceeded) {
		t.Errorf("Err %v, Cause %v: want DeadlineExceeded", first.Err(), context.Cause(first))
	}
}

// Releases are bounded by one TTL even when the caller's context was cancelled (go-zero's
// timeout handler): the release context has the caller's values, a deadline no later than one
// TTL, and is not done.
func TestReleaseContextOutlivesTheRequest(t *testing.T) {
	k := &keeper{ttl: time.Second, ttlBound: &sharedBound{span: time.Second}}
	req, cancel := context.WithCancel(context.WithValue(context.Background(), valueKey{}, "trace"))
	cancel()
	before := time.Now()
	rctx := k.releaseContext(req)
	if rctx.Err() != nil {
		t.Fatalf("release context of a cancelled request is done: %v", rctx.Err())
	}
	d, ok := rctx.Deadline()
	if !ok || d.After(time.Now().Add(time.Second)) || d.Before(before.Add(time.Second-time.Second/16)) {
		t.Errorf("deadline %v from now, want within one TTL and no earlier than 15/16 of it", time.Until(d))
	}
	if rctx.Value(valueKey{}) != "trace" {
		t.Error("the request's values are lost in the release")
	}
}

package flightlock

import (
	"context"
	"fmt"
)

// endGrantBy ends h's grant as endGrant does, and returns by the end of ctx whatever the store
// does: a release that ctx's end cuts short goes on in the background on a context that keeps
// ctx's values but not its cancellation, bounded by one TTL (releaseContext), and the caller
// gets ctx's cause, wrapped. The lock is then freed when the store answers, or left to its TTL
// when it never does; in both cases nobody else's lock is touched (the release is
// owner-checked), and the gate slot is left only when the release has ended.
//
// A context that never ends (context.Background, context.WithoutCancel: the middleware's
// release) waits for the release itself, bounded by one TTL, with no goroutine.
func (k *keeper) endGrantBy(ctx context.Context, h *hold) error {
	done := ctx.Done()
	if done == nil {
		return k.endGrant(ctx, h)
	}
	result := make(chan error, 1)
	go func() { result <- k.endGrant(context.WithoutCancel(ctx), h) }()
	select {
	case err := <-result:
		return err
	case <-done:
	}
	select {
	case err := <-result: // finished as ctx ended: its own outcome is known
		return err
	default:
		return fmt.Errorf("flightlock: release of %q not confirmed before the caller's context ended; it goes on in the background: %w",
			h.key, context.Cause(ctx))
	}
}

package middleware

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

// drainStragglers is how long handlers get to return once the grace period ended and their
// contexts were cancelled: with the default Drain, within go-zero's default Shutdown.WaitTime.
const drainStragglers = time.Second

// drainer runs a Middleware's drain once, from go-zero's shutdown listeners or Shutdown.
type drainer struct {
	grace time.Duration
	once  sync.Once
	done  chan struct{} // closed when the drain ended; err is set before
	err   error
	// leftHolds: the drain ended with locks still held, so a store whose Close would end those
	// holds stays open (set before Shutdown closes the stores; read by their closers).
	leftHolds atomic.Bool
}

// Shutdown drains the Middleware once, for LockConf.Drain or until ctx ends, then closes the stores
// it built. Handlers still running then have their contexts cancelled and a second more to return,
// so it may return a second after ctx ends; another call meanwhile waits while its ctx lets it.
// Locks still held then are not released, as their handlers may run: they run out with their TTL
// (on ZooKeeper, the session) once the process exits. go-zero's shutdown listeners call it (New
// registers one); call it where the service stops otherwise.
func (m *Middleware) Shutdown(ctx context.Context) error {
	first := false
	m.drain.once.Do(func() { first = true })
	if !first {
		select {
		case <-m.drain.done:
			return m.drain.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := m.drainAll(ctx, m.drain.grace)
	if err != nil {
		logx.Errorw("flightlock: shutdown: handlers still hold locks after the grace period; their contexts were cancelled",
			logx.Field("grace", m.drain.grace), logx.Field("error", err.Error()))
		if err = m.drainAll(context.WithoutCancel(ctx), drainStragglers); err != nil {
			logx.Errorw("flightlock: shutdown: locks left to their TTL: their handlers did not return",
				logx.Field("error", err.Error()))
		}
	}
	m.drain.leftHolds.Store(err != nil)
	if cerr := m.Close(); cerr != nil && err == nil {
		err = cerr
	}
	m.drain.err = err
	close(m.drain.done)
	return err
}

// drainAll drains every base Locker of m at once, within timeout and ctx.
func (m *Middleware) drainAll(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lockers := slices.Collect(maps.Values(m.bases))
	errs := make([]error, len(lockers))
	var wg sync.WaitGroup
	for i, l := range lockers {
		wg.Go(func() { errs[i] = l.Drain(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Package zsetsem is the naive Redis semaphore the benchmark measures flightlock's permits
// against: the classic sorted-set recipe, written for the benchmark. The holders of a key are
// the members of one sorted set, each scored with its expiry; a taker removes the expired
// members and joins if fewer than n remain (acquire.lua, one script), a holder pushes its
// expiry ahead every TTL/3 while it holds and removes its member on release, and a refused
// taker sleeps a fixed poll interval and tries again. There is no queue and no notification:
// waiters find a free permit only by polling.
package zsetsem

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrBusy is what TryAcquire returns when every permit is held.
var ErrBusy = errors.New("zsetsem: every permit is held")

var (
	//go:embed acquire.lua
	acquireSource string
	acquireScript = redis.NewScript(acquireSource)

	//go:embed renew.lua
	renewSource string
	renewScript = redis.NewScript(renewSource)
)

// Replies of acquire.lua and renew.lua.
const (
	replyRefused = 0
	replyHeld    = 1
)

// Client is what the semaphore needs of a go-redis client: its scripts, and ZREM to release.
type Client interface {
	redis.Scripter
	ZRem(ctx context.Context, key string, members ...any) *redis.IntCmd
}

// Semaphore gives at most permits holders of a key at once. Build it with New.
type Semaphore struct {
	client  Client
	permits int
	ttl     time.Duration
	poll    time.Duration
}

// New returns a semaphore of permits permits per key on client: a permit outlives a holder
// that stopped renewing by ttl, and a refused Acquire tries again every poll.
func New(client Client, permits int, ttl, poll time.Duration) *Semaphore {
	return &Semaphore{client: client, permits: permits, ttl: ttl, poll: poll}
}

// Permit is one held permit of a key; Release gives it back.
type Permit struct {
	sem    *Semaphore
	key    string
	member string
	stop   chan struct{} // closed by Release: the renewer ends
	done   chan struct{} // closed by the renewer once it has ended
	once   sync.Once
}

// TryAcquire makes one attempt at a permit of key: ErrBusy when every one is held.
func (s *Semaphore) TryAcquire(ctx context.Context, key string) (*Permit, error) {
	member := rand.Text()
	reply, err := acquireScript.Run(ctx, s.client, []string{key}, member, s.permits, s.ttl.Milliseconds()).Int64()
	if err != nil {
		return nil, fmt.Errorf("zsetsem: acquire %s: %w", key, err)
	}
	switch reply {
	case replyHeld:
	case replyRefused:
		return nil, ErrBusy
	default:
		return nil, fmt.Errorf("zsetsem: acquire %s: unexpected reply %d", key, reply)
	}
	p := &Permit{sem: s, key: key, member: member, stop: make(chan struct{}), done: make(chan struct{})}
	go p.renew()
	return p, nil
}

// Acquire takes a permit of key, trying again every poll interval while every permit is held,
// until ctx ends.
func (s *Semaphore) Acquire(ctx context.Context, key string) (*Permit, error) {
	for {
		p, err := s.TryAcquire(ctx, key)
		if !errors.Is(err, ErrBusy) {
			return p, err
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ErrBusy, ctx.Err())
		case <-time.After(s.poll):
		}
	}
}

// renew pushes the permit's expiry one TTL ahead every TTL/3 until Release, so that a holder
// that runs longer than the TTL keeps its permit; it gives up once the permit is lost.
func (p *Permit) renew() {
	defer close(p.done)
	t := time.NewTicker(p.sem.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.sem.ttl/3)
		reply, err := renewScript.Run(ctx, p.sem.client, []string{p.key}, p.member, p.sem.ttl.Milliseconds()).Int64()
		cancel()
		if err == nil && reply == replyRefused {
			return
		}
	}
}

// Release stops the renewal and gives the permit back. A second call does nothing.
func (p *Permit) Release(ctx context.Context) error {
	var err error
	p.once.Do(func() {
		close(p.stop)
		<-p.done // no renewal may run after the member is removed
		if e := p.sem.client.ZRem(ctx, p.key, p.member).Err(); e != nil {
			err = fmt.Errorf("zsetsem: release %s: %w", p.key, e)
		}
	})
	return err
}

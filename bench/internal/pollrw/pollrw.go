// Package pollrw is the naive Redis read-write lock the benchmark measures flightlock's read
// locks against, written for the benchmark from the usual recipe: SET NX for the writer, a
// sorted set of readers, and polling for every wait. A key has a write mark ("{key}:w", SET NX
// PX with the writer's token) and a set of readers ("{key}:r", each member scored with its
// expiry in ms on the client's clock, so that a reader that died stops counting after the
// TTL).
//
// A writer sets the mark (polling while another writer holds it), then polls until no
// unexpired reader is left. A reader adds itself to the set and, in the same pipeline, looks
// at the mark; if a writer holds it, the reader takes itself out again and polls until the
// mark is gone. The order of the two steps on each side is what excludes: a writer that found
// no reader set its mark before it looked, so a reader that joined later sees the mark and
// backs off; a reader that saw no mark joined before it looked, so a writer that set its mark
// later finds it in the set and waits. New readers back off while a writer holds the mark or
// waits for the readers to leave, so writers are preferred, as flightlock's are.
//
// There is no queue, no notification and no renewal: waiters find a free lock only by polling,
// and a hold must end within the TTL (the benchmark's holds are microseconds against 10 s).
package pollrw

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrBusy is what TryLock returns when the key is held or awaited by a writer, or read.
var ErrBusy = errors.New("pollrw: the key is held")

var (
	//go:embed release.lua
	releaseSource string
	releaseScript = redis.NewScript(releaseSource)
)

// Client is what the lock needs of a go-redis client.
type Client interface {
	redis.Scripter
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
	ZCount(ctx context.Context, key, lo, hi string) *redis.IntCmd
	ZRem(ctx context.Context, key string, members ...any) *redis.IntCmd
	Exists(ctx context.Context, keys ...string) *redis.IntCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// RWLock hands out read and write locks of keys. Build it with New.
type RWLock struct {
	client Client
	ttl    time.Duration
	poll   time.Duration
}

// New returns a read-write lock on client: a hold outlives a holder that died by ttl, and
// every wait polls every poll.
func New(client Client, ttl, poll time.Duration) *RWLock {
	return &RWLock{client: client, ttl: ttl, poll: poll}
}

// Hold is one held lock, read or write; Release gives it back.
type Hold struct {
	rw    *RWLock
	key   string // the write mark or the readers' set
	token string
	read  bool
}

func writeKey(key string) string { return "{" + key + "}:w" }
func readKey(key string) string  { return "{" + key + "}:r" }

func nowMs() int64 { return time.Now().UnixMilli() }

// Lock takes the write lock of key: it sets the key's write mark, polling while another
// writer holds it, then polls until no reader is left, until ctx ends.
func (l *RWLock) Lock(ctx context.Context, key string) (*Hold, error) { return l.lock(ctx, key, true) }

// TryLock makes one attempt at the write lock of key: ErrBusy when a writer holds the mark or
// a reader holds the key.
func (l *RWLock) TryLock(ctx context.Context, key string) (*Hold, error) {
	return l.lock(ctx, key, false)
}

// lock is Lock when wait, and TryLock, whose every poll is ErrBusy instead.
func (l *RWLock) lock(ctx context.Context, key string, wait bool) (*Hold, error) {
	h := &Hold{rw: l, key: writeKey(key), token: rand.Text()}
	for {
		ok, err := l.client.SetNX(ctx, h.key, h.token, l.ttl).Result()
		if err != nil {
			return nil, fmt.Errorf("pollrw: lock %s: %w", key, err)
		}
		if ok {
			break
		}
		if err := l.sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
	for {
		n, err := l.readers(ctx, key)
		if err == nil && n == 0 {
			return h, nil
		}
		if err == nil {
			err = l.sleep(ctx, wait)
		}
		if err != nil {
			l.giveUp(ctx, h)
			return nil, err
		}
	}
}

// RLock takes a read lock of key: it joins the key's readers and looks at the write mark in
// one pipeline; while a writer holds the mark, it leaves the readers and polls until the mark
// is gone, until ctx ends.
func (l *RWLock) RLock(ctx context.Context, key string) (*Hold, error) {
	h := &Hold{rw: l, key: readKey(key), token: rand.Text(), read: true}
	wk := writeKey(key)
	for {
		var marked *redis.IntCmd
		_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.ZAdd(ctx, h.key, redis.Z{Score: float64(nowMs() + l.ttl.Milliseconds()), Member: h.token})
			p.PExpire(ctx, h.key, l.ttl)
			marked = p.Exists(ctx, wk)
			return nil
		})
		if err != nil {
			l.giveUp(ctx, h)
			return nil, fmt.Errorf("pollrw: rlock %s: %w", key, err)
		}
		if marked.Val() == 0 {
			return h, nil
		}
		if err := h.Release(ctx); err != nil {
			return nil, err
		}
		for marked.Val() != 0 {
			if err := l.sleep(ctx, true); err != nil {
				return nil, err
			}
			marked = l.client.Exists(ctx, wk)
			if err := marked.Err(); err != nil {
				return nil, fmt.Errorf("pollrw: rlock %s: %w", key, err)
			}
		}
	}
}

// readers counts key's readers whose expiry lies ahead.
func (l *RWLock) readers(ctx context.Context, key string) (int64, error) {
	n, err := l.client.ZCount(ctx, readKey(key), "("+strconv.FormatInt(nowMs(), 10), "+inf").Result()
	if err != nil {
		return 0, fmt.Errorf("pollrw: readers of %s: %w", key, err)
	}
	return n, nil
}

// sleep waits one poll interval, or until ctx ends; a wait that may not poll (TryLock) is
// ErrBusy at once.
func (l *RWLock) sleep(ctx context.Context, wait bool) error {
	if !wait {
		return ErrBusy
	}
	select {
	case <-ctx.Done():
		return errors.Join(ErrBusy, ctx.Err())
	case <-time.After(l.poll):
		return nil
	}
}

// giveUp takes back what a Lock that failed had set, past the end of its context, so that the
// mark or the reader entry does not stay for a TTL.
func (l *RWLock) giveUp(ctx context.Context, h *Hold) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = h.Release(rctx)
}

// Release gives the hold back: a reader leaves the readers, a writer deletes its mark if it
// still holds it.
func (h *Hold) Release(ctx context.Context) error {
	var err error
	if h.read {
		err = h.rw.client.ZRem(ctx, h.key, h.token).Err()
	} else {
		err = releaseScript.Run(ctx, h.rw.client, []string{h.key}, h.token).Err()
	}
	if err != nil {
		return fmt.Errorf("pollrw: release %s: %w", h.key, err)
	}
	return nil
}

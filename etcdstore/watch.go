package etcdstore

import (
	"context"
	"time"

	"github.com/flightlock/flightlock/lockstore"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// rewatchPause is how long a watch that etcd ended (no leader, compaction) waits before it
// watches again; the waiter was signalled meanwhile and retries on its own.
const rewatchPause = 100 * time.Millisecond

// Watch implements lockstore.Store with etcd watches that signal each deletion of key (a
// release or an expiry) and of any key in its side directory (a read hold's end, which a writer
// waits for; a place leaving the line), from this store's last busy reply for key, so that no
// release in between is missed. When etcd ends the watch (no leader, compaction), the channel
// is signalled and the watch starts again. It ends with ctx, its Close, or the store's. One
// goroutine per Watch.
func (s *Store) Watch(ctx context.Context, key string) (*lockstore.Watch, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	s.mu.Lock()
	rev := s.waitRev[key]
	delete(s.waitRev, key)
	s.mu.Unlock()
	if rev > 0 {
		rev++ // the first revision after the one that found the key held
	}
	c := make(chan struct{}, 1)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel) // Close of the store ends it too
	if !s.spawn(func() {
		defer stop()
		defer cancel()
		s.watch(wctx, key, rev, c)
	}) {
		stop()
		cancel()
		return nil, errStoreClosed
	}
	if rev == 0 {
		// No busy reply to start from: a release before now may have gone unheard.
		return lockstore.NewFreshWatch(c, cancel), nil
	}
	return lockstore.NewWatch(c, cancel), nil
}

// watch signals c on each deletion of key or of a key in its side directory from revision rev
// (0: from now) until ctx ends.
func (s *Store) watch(ctx context.Context, key string, rev int64, c chan struct{}) {
	signal := func() {
		select {
		case c <- struct{}{}:
		default: // one pending wake-up is enough
		}
	}
	// A member without a leader cannot tell deletions: it ends the watch rather than go silent.
	lctx := clientv3.WithRequireLeader(ctx)
	revs := [2]int64{rev, rev} // where the watches of key and of its side directory go on (0: now)
	for {
		rctx, cancel := context.WithCancel(lctx)
		watches := [2]clientv3.WatchChan{
			s.cli.Watch(rctx, key, clientv3.WithFilterPut(), clientv3.WithRev(revs[0])),
			s.cli.Watch(rctx, sideDir(key), clientv3.WithFilterPut(), clientv3.WithRev(revs[1]), clientv3.WithPrefix()),
		}
		for ended := false; !ended; {
			resp, i, ok := nextOf(nil, watches)
			if !ok {
				// A cancelled watch is followed by the channel's close: both start again.
				ended = true
				continue
			}
			if resp.CompactRevision != 0 {
				revs[i] = 0 // deletions up to the compaction are unknown: assume one
				signal()
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					signal()
				}
				revs[i] = ev.Kv.ModRevision + 1
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		signal() // etcd ended the watch: the key may have been released meanwhile
		if !sleep(ctx.Done(), rewatchPause) {
			return
		}
	}
}

// nextOf receives the next response of either watch of ws, and which one sent it; ok is false
// when that watch is closed, or when done is closed first (a nil done never is).
func nextOf(done <-chan struct{}, ws [2]clientv3.WatchChan) (resp clientv3.WatchResponse, i int, ok bool) {
	select {
	case <-done:
	case resp, ok = <-ws[0]:
	case resp, ok = <-ws[1]:
		i = 1
	}
	return resp, i, ok
}

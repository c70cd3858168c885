package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is returned (wrapped, with the counts) by Acquire, Reenter and Refresh when
// too few replicas acknowledged the write in time (see WithReplicas). It is a store error.
var ErrNotReplicated = errors.New("flightlock: write not acknowledged by enough replicas")

// WithReplicas makes a write that grants or extends a lock (Acquire, Reenter, Refresh) count
// only once n replicas acknowledged it within timeout (a WAIT after the script, in one pipeline
// to the key's primary). An acquisition a failover could lose is released again and returns
// ErrNotReplicated. A refresh without the acknowledgements returns ErrNotReplicated, and the
// lease keeps its last acknowledged write's validity.
// Releases do not wait: one lost in a failover leaves the key to its TTL, delaying the next
// holder but never admitting two. WAIT is per connection, so these calls take one each, outside
// the batches. n is at most the primary's replicas (<= 0, the default: off); on a Cluster, of
// the node that ran the script (the slot's master, or the one a MOVED or ASK named).
func WithReplicas(n int, timeout time.Duration) Option {
	return func(s *RedisStore) {
		s.replicas, s.replicaTimeout = max(n, 0), max(timeout, time.Millisecond)
	}
}

// exec runs script as run does or, WithReplicas, by runAcked (its error in the returned
// command); acked is how many replicas acknowledged it (0 without WithReplicas).
func (s *RedisStore) exec(ctx context.Context, script *redis.Script, keys []string, late func(*redis.Cmd), args ...any) (cmd *redis.Cmd, acked int64) {
	if s.replicas == 0 {
		return s.run(ctx, script, keys, late, args...), 0
	}
	cmd, acked, err := s.runAcked(ctx, script, keys, args...)
	if err != nil {
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd, acked
}

// unacked reports whether a write that acked replicas acknowledged is too few for WithReplicas.
func (s *RedisStore) unacked(acked int64) bool { return s.replicas > 0 && acked < int64(s.replicas) }

// runAcked runs script then WAIT in a pipeline on keys[0]'s primary, returning the reply and
// the replicas that acknowledged it; after NOSCRIPT (nothing ran) once more with EVAL. A node's
// client follows no redirects, so runAcked does, up to maxRedirects (MOVED: to that node,
// reloading the slot map; ASK: after ASKING), or a migrating lock's renewals would all fail
// until the slot map caught up, losing the lock.
func (s *RedisStore) runAcked(ctx context.Context, script *redis.Script, keys []string, args ...any) (*redis.Cmd, int64, error) {
	node, err := s.primaryFor(ctx, keys[0])
	if err != nil {
		return nil, 0, err
	}
	var (
		asking    bool // node is the target of an ASK: the script must follow ASKING
		eval      bool // node answered NOSCRIPT: send the script's body
		redirects int
	)
	for {
		p := node.Pipeline()
		if asking {
			p.Do(ctx, "ASKING") // for the next command only
		}
		send := script.EvalSha
		if eval {
			send = script.Eval
		}
		cmd := send(ctx, p, keys, args...)
		wait := p.Do(ctx, "WAIT", s.replicas, s.replicaTimeout.Milliseconds())
		_, _ = p.Exec(ctx) // each command carries its own error
		err := cmd.Err()
		if err != nil && !eval && redis.HasErrorPrefix(err, "NOSCRIPT") {
			eval = true
			continue
		}
		if addr, ask, ok := redirectTo(err, node); ok && redirects < maxRedirects {
			if next, ok := s.redirectNode(ctx, addr); ok {
				if !ask {
					s.reloadSlots() // later calls go to the new master through the slot map
				}
				node, asking, eval = next, ask, false
				redirects++
				continue
			}
		}
		if err != nil {
			return cmd, 0, nil // the script's own error, for the caller to report
		}
		// A WAIT that failed acknowledged nothing: the script's reply stands, with 0 replicas,
		// so that a grant it made is given back (ErrNotReplicated) rather than lost with it.
		acked, _ := wait.Int64()
		return cmd, acked, nil
	}
}

// maxRedirects bounds the redirects one acknowledged call follows, as go-redis's
// ClusterOptions.MaxRedirects (default 3): a migration redirects a call once or twice.
const maxRedirects = 3

// redirectTo parses a reply "MOVED|ASK <slot> <host:port>" from node (no host: node's own).
func redirectTo(err error, node pipeliner) (addr string, ask, ok bool) {
	if !isRedirect(err) {
		return "", false, false
	}
	var re redis.Error
	errors.As(err, &re)
	f := strings.Fields(re.Error())
	if len(f) != 3 {
		return "", false, false
	}
	addr = f[2]
	if strings.HasPrefix(addr, ":") {
		c, isClient := node.(*redis.Client)
		if !isClient {
			return "", false, false
		}
		host, _, _ := net.SplitHostPort(c.Options().Addr)
		addr = net.JoinHostPort(host, addr[1:])
	}
	return addr, f[0] == "ASK", true
}

// redirectNode returns go-redis's client of the Cluster node at addr; false when there is none
// (the redirect is then reported, and the call tried again later).
func (s *RedisStore) redirectNode(ctx context.Context, addr string) (pipeliner, bool) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return nil, false
	}
	var (
		mu   sync.Mutex
		node *redis.Client
	)
	_ = cc.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			node = c
			mu.Unlock()
		}
		return nil
	})
	return node, node != nil
}

// primaryFor is key's primary: its slot's master on a Cluster, else the client (node or Sentinel).
func (s *RedisStore) primaryFor(ctx context.Context, key string) (pipeliner, error) {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("master of %q: %w", key, err)
		}
		return node, nil
	}
	if p, ok := s.client.(pipeliner); ok {
		return p, nil
	}
	return nil, fmt.Errorf("WithReplicas: the client %T has no pipelines to send WAIT on", s.client)
}

// notReplicated is the error of a write that acked replicas of s.replicas acknowledged.
func (s *RedisStore) notReplicated(acked int64) error {
	return fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, acked, s.replicas, s.replicaTimeout)
}

// isRedirect reports a MOVED or ASK reply past the redirects go-redis (or runAcked) follows:
// the slot moves; nothing ran. It checks err for nil first: HasErrorPrefix allocates.
func isRedirect(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "MOVED ") || redis.HasErrorPrefix(err, "ASK "))
}

// tryAgainPause is how long a release waits before it sends a call that got TRYAGAIN again.
const tryAgainPause = 10 * time.Millisecond

// slotMoving reports a TRYAGAIN (a script's keys split between two nodes mid-migration), MOVED
// or ASK reply: the slot migrates, nothing ran. A redirect makes a Cluster client reload slots.
func (s *RedisStore) slotMoving(err error) bool {
	if isRedirect(err) {
		s.reloadSlots()
		return true
	}
	return err != nil && redis.HasErrorPrefix(err, "TRYAGAIN")
}

// failed is op's error on key. Without a Redis error reply, a Cluster client reloads its slot
// map: the master may have died for a promoted replica, else learnt from a MOVED or in a minute.
func (s *RedisStore) failed(op, key string, err error) error {
	var reply redis.Error
	if !errors.As(err, &reply) || errors.Is(err, redis.ErrClosed) {
		s.reloadSlots()
	}
	return fmt.Errorf("flightlock: %s %q: %w", op, key, err)
}

// reloadSlots makes a Cluster client reload its slot map (lazily, one reload at a time).
func (s *RedisStore) reloadSlots() {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}

package lockstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is returned (wrapped, with the counts) by Acquire, Reenter and Refresh of a
// store built WithReplicas when fewer replicas than required acknowledged the write in time.
// An acquisition or re-entry that was not acknowledged has been given up again; a refresh
// that was not acknowledged did not extend the lease. Callers treat it as a store error.
var ErrNotReplicated = errors.New("flightlock: write not acknowledged by enough replicas")

// WithReplicas makes every write that grants or extends a lock (Acquire, Reenter, Refresh)
// count only once n replicas acknowledged it within timeout: the script and a WAIT n timeout
// go to the key's primary in one pipeline, one round trip. An acquisition a failover could
// lose is then not handed out: without enough acknowledgements it is released again and
// Acquire returns ErrNotReplicated (a store error); a refresh without them returns
// ErrNotReplicated and the lease keeps the validity of its last acknowledged write.
//
// Releases do not wait: a release lost in a failover leaves the key to expire with its TTL,
// which delays the next holder but never admits two.
//
// WAIT is per connection, so these calls do not join the batched pipelines (WithLanes): each
// takes a connection of its own. n is at most the replicas the primary has; n <= 0 turns the
// acknowledgement off (the default). On a Cluster the pipeline goes to the master of the key's
// slot, so WAIT counts that shard's replicas.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(s *RedisStore) {
		s.replicas, s.replicaTimeout = max(n, 0), max(timeout, time.Millisecond)
	}
}

// runAcked runs script on the primary of keys[0] followed by WAIT in one pipeline, and returns
// the script's reply and how many replicas acknowledged it. A NOSCRIPT reply loads the script
// and sends the pipeline once more (the script did not run).
func (s *RedisStore) runAcked(ctx context.Context, script *redis.Script, keys []string, args ...any) (*redis.Cmd, int64, error) {
	node, err := s.primaryFor(ctx, keys[0])
	if err != nil {
		return nil, 0, err
	}
	for attempt := 0; ; attempt++ {
		var (
			cmd  *redis.Cmd
			wait *redis.Cmd
		)
		p := node.Pipeline()
		cmd = script.EvalSha(ctx, p, keys, args...)
		wait = p.Do(ctx, "WAIT", s.replicas, s.replicaTimeout.Milliseconds())
		_, _ = p.Exec(ctx) // each command carries its own error
		if err := cmd.Err(); err != nil && attempt == 0 && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			if sc, ok := node.(redis.Scripter); ok {
				if err := script.Load(ctx, sc).Err(); err != nil {
					return nil, 0, err
				}
				continue
			}
		}
		if cmd.Err() != nil {
			return cmd, 0, nil // the script's own error; the caller reports it
		}
		acked, err := wait.Int64()
		if err != nil {
			return cmd, 0, fmt.Errorf("WAIT: %w", err)
		}
		return cmd, acked, nil
	}
}

// primaryFor is the client of the primary that holds key: the master of its slot on a Cluster,
// the client itself otherwise (a node, or Sentinel's failover client, which talks to the
// primary).
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

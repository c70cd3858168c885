package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// forceRelease deletes a lock only while it is still the grant the operator saw (same owner,
// same fence), and wakes the waiters of other processes. Comparing the grant, not just the key,
// means a lock that changed hands between "show" and the confirmation is never removed: the
// operator agreed to remove one holder, not whoever holds the key now.
//
// KEYS[1] lock key; ARGV[1] "<owner> <fence> ", the start of the value of that grant;
// ARGV[2] its release notification channel.
// Replies {1, woken waiters} when deleted, {0, current value or ""} when not.
var forceRelease = redis.NewScript(`
local current = redis.call('GET', KEYS[1])
if not current or string.sub(current, 1, #ARGV[1]) ~= ARGV[1] then
  return {0, current or ''}
end
redis.call('DEL', KEYS[1])
return {1, redis.call('PUBLISH', ARGV[2], '1')}
`)

// unlockResult is what "unlock -o json" prints.
type unlockResult struct {
	Removed lockInfo `json:"removed"`
	// Woken (Redis) counts the processes its release notification reached.
	Woken *int64 `json:"woken_processes,omitempty"`
	// WaiterMark (etcd) says whether the key's waiter mark was set, and so deleted with it:
	// processes that were refused it wait on a watch of its deletion, which wakes them.
	WaiterMark *bool `json:"waiter_mark_deleted,omitempty"`
}

// cmdUnlock is "unlock KEY": show the lock, ask, remove exactly that grant, print what went.
func cmdUnlock(ctx context.Context, c backend, out *printer, o options, key string, stdin io.Reader, stderr io.Writer) error {
	rctx, cancel := context.WithTimeout(ctx, o.timeout)
	l, err := c.lookup(rctx, key)
	cancel()
	if err != nil {
		return fmt.Errorf("%w; nothing removed", err)
	}
	if l.Unrecognized != "" {
		return fmt.Errorf("%s is not a flightlock lock (value %s); nothing removed", quoteIfOdd(storeKey(l)), quoteIfOdd(l.Unrecognized))
	}
	if !o.yes {
		if err := lockDetail(stderr, l); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "\nForce-release %s? Its holder may still be running, and the next request then "+
			"runs beside it (it learns of the loss at its next renewal). [y/N] ", quoteIfOdd(storeKey(l)))
		answer, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return fmt.Errorf("not confirmed; nothing removed")
		}
	}

	rctx, cancel = context.WithTimeout(ctx, o.timeout)
	defer cancel()
	res, err := c.forceUnlock(rctx, l)
	if err != nil {
		return err
	}
	res.Removed = l
	if out.json {
		return out.encode(res)
	}
	if l.Store == storeEtcd {
		mark := "no waiter mark: no request was refused it"
		if res.WaiterMark != nil && *res.WaiterMark {
			mark = "deleted its waiter mark: the processes waiting for it watch its deletion and wake now"
		}
		_, err = fmt.Fprintf(out.w, "removed %s: fence %d holds %s ttl %s %s; %s\n",
			quoteIfOdd(l.EtcdKey), l.Fence, holdsString(l), ttlString(l.TTLMillis), holderString(l), mark)
		return err
	}
	_, err = fmt.Fprintf(out.w, "removed %s: owner %s fence %d holds %s ttl %s %s; woke %d waiting process(es)\n",
		quoteIfOdd(l.RedisKey), quoteIfOdd(l.Owner), l.Fence, holdsString(l), ttlString(l.TTLMillis), holderString(l), *res.Woken)
	return err
}

// storeKey is the key of l in its store.
func storeKey(l lockInfo) string {
	if l.Store == storeEtcd {
		return l.EtcdKey
	}
	return l.RedisKey
}

// forceUnlock runs forceRelease on the grant l (its owner and fence).
func (c *client) forceUnlock(ctx context.Context, l lockInfo) (unlockResult, error) {
	reply, err := forceRelease.Run(ctx, c.rdb, []string{l.RedisKey},
		l.Owner+" "+strconv.FormatInt(l.Fence, 10)+" ", c.channel(l.Key)).Slice()
	if err != nil {
		return unlockResult{}, fmt.Errorf("unlock %s: %w", quoteIfOdd(l.RedisKey), err)
	}
	if len(reply) != 2 {
		return unlockResult{}, fmt.Errorf("unlock %s: unexpected reply %v", quoteIfOdd(l.RedisKey), reply)
	}
	if done, _ := reply[0].(int64); done != 1 {
		now := "released since"
		if v, _ := reply[1].(string); v != "" {
			var cur lockInfo
			parseLock(&cur, v)
			now = "now held by " + short(cur.Owner) + " fence " + strconv.FormatInt(cur.Fence, 10)
		}
		return unlockResult{}, fmt.Errorf("%s changed after it was read (%s); nothing removed", quoteIfOdd(l.RedisKey), now)
	}
	woken, _ := reply[1].(int64)
	return unlockResult{Woken: &woken}, nil
}

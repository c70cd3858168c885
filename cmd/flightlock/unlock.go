package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/flightlock/flightlock/lockstore"
)

// unlockResult is what "unlock -o json" prints.
type unlockResult struct {
	Removed lockInfo `json:"removed"`
	// Woken (Redis) counts the subscribers its release notification reached: the processes
	// waiting for it, and any flightlock watch (which subscribes to every release of its
	// pattern), which Redis does not tell apart.
	Woken *int64 `json:"woken_processes,omitempty"`
	// WaiterMark (etcd, ZooKeeper) says whether the key's waiter mark was set, and so deleted
	// with it: processes that were refused it wait on a watch of its deletion, which wakes them.
	WaiterMark *bool `json:"waiter_mark_deleted,omitempty"`
}

// cmdUnlock is "unlock KEY": show the lock, ask, remove exactly that grant, print what went.
// The store removes the grant only while it is the one shown (same owner and fence in Redis,
// same revision in etcd, same node in ZooKeeper): a lock that changed hands between "show" and the confirmation is
// never removed, as the operator agreed to remove one holder, not whoever holds the key now.
func cmdUnlock(ctx context.Context, c *backend, out *printer, o options, key string, stdin io.Reader, stderr io.Writer) error {
	rctx, cancel := context.WithTimeout(ctx, o.timeout)
	found, err := c.Lookup(rctx, key)
	if errors.Is(err, lockstore.ErrNotHeld) {
		err = notHeld(rctx, c, key)
	}
	cancel()
	if err != nil {
		return fmt.Errorf("%w; nothing removed", err)
	}
	l := view(found, c.store())
	if l.Unrecognized != "" {
		return fmt.Errorf("%w; nothing removed", notALock(l))
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
	notified, err := c.ForceUnlock(rctx, found)
	if changed, ok := errors.AsType[*lockstore.ChangedError](err); ok {
		return fmt.Errorf("%s changed after it was read (%s); nothing removed", quoteIfOdd(storeKey(l)), whatChanged(l, changed.Now))
	}
	if err != nil {
		return fmt.Errorf("unlock %s: %w", quoteIfOdd(storeKey(l)), err)
	}
	res := unlockResult{Removed: l}
	if c.store() != storeRedis {
		marked := notified > 0
		res.WaiterMark = &marked
	} else {
		woken := int64(notified)
		res.Woken = &woken
	}
	if out.json {
		return out.encode(res)
	}
	tail := fmt.Sprintf("its release reached %d subscriber(s) (processes waiting for it, and any flightlock watch)", notified)
	if c.store() != storeRedis {
		tail = "no waiter mark: no request was refused it"
		if *res.WaiterMark {
			tail = "deleted its waiter mark: the processes waiting for it watch its deletion and wake now"
		}
	}
	_, err = fmt.Fprint(out.w, removedLine(l, tail))
	return err
}

// removedLine is unlock's line for the grant l that it removed, then tail: what the removal woke.
// A key held for reading has readers, not an owner's holds; etcd and ZooKeeper show no owner.
func removedLine(l lockInfo, tail string) string {
	parts := []string{"removed " + quoteIfOdd(storeKey(l)) + ":"}
	if l.Readers > 0 {
		parts = append(parts, readersString(l.Readers))
	} else {
		if l.Store == "" {
			parts = append(parts, "owner "+quoteIfOdd(l.Owner))
		}
		parts = append(parts, "fence "+strconv.FormatInt(l.Fence, 10), "holds "+holdsString(l))
	}
	parts = append(parts, "ttl "+ttlCell(l))
	if h := holderString(l); h != "" {
		parts = append(parts, h)
	}
	return strings.Join(parts, " ") + "; " + tail + "\n"
}

// whatChanged says what the key holds now instead of the grant l: nothing (now nil), the same
// grant with other holds (etcd), or another grant.
func whatChanged(l lockInfo, now *lockstore.LockInfo) string {
	switch {
	case now == nil:
		return "released since"
	case l.Store == storeZookeeper:
		return "now held by a new grant, fence " + strconv.FormatInt(now.Fence, 10)
	case l.Store != storeEtcd:
		return "now held by " + short(now.Owner) + " fence " + strconv.FormatInt(now.Fence, 10)
	case now.CreateRevision == l.CreateRevision:
		return "the same grant, its holds changed"
	}
	return "now held by a new grant at revision " + strconv.FormatInt(now.CreateRevision, 10)
}

// storeKey is the key of l in its store.
func storeKey(l lockInfo) string {
	switch l.Store {
	case storeEtcd:
		return l.EtcdKey
	case storeZookeeper:
		return l.ZNode
	}
	return l.RedisKey
}

package zkstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/internal/glob"
	"github.com/flightlock/flightlock/lockstore"
)

// Inspector is the lockstore.Inspector of a Store's locks under one prefix.
type Inspector struct {
	s      *Store
	prefix string
}

var _ lockstore.Inspector = (*Inspector)(nil)

// NewInspector returns the inspector of the locks under prefix (the Locker's WithPrefix) in s.
func NewInspector(s *Store, prefix string) *Inspector { return &Inspector{s: s, prefix: prefix} }

// The middleware finds a store's name and response store through Describer, at run time.
var _ lockstore.Describer = (*Store)(nil)

// Describe implements lockstore.Describer: "zookeeper" and its inspector, for keys under prefix;
// no Responses, and CloseEndsHolds (closing ends its session, and every hold with it).
func (s *Store) Describe(prefix string) *lockstore.Backend {
	return &lockstore.Backend{Name: "zookeeper", Store: s, Prefix: prefix, Inspector: NewInspector(s, prefix), CloseEndsHolds: true}
}

// List implements lockstore.Inspector: the key nodes under the root whose keys carry the prefix
// and match pattern; other nodes (a line beside a key node) are not listed.
func (in *Inspector) List(ctx context.Context, pattern string, opts lockstore.ListOptions) ([]lockstore.LockInfo, int, error) {
	names, err := in.s.children(ctx, in.s.root)
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", in.s.root, err)
	}
	var keys []string
	for _, n := range names {
		full, ok := keyOf(n)
		k, under := strings.CutPrefix(full, in.prefix)
		if !ok || !under || opts.Skip != nil && opts.Skip(k) || !glob.Match(pattern, k) {
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var locks []lockstore.LockInfo
	more := 0
	for _, k := range keys {
		l, _, _, err := in.read(ctx, k)
		switch {
		case errors.Is(err, lockstore.ErrNotHeld):
			continue
		case errors.Is(err, zk.ErrNoAuth):
			// A node whose ACL refuses this session is no Store's (they make every node
			// readable by all): one such node cannot hide the locks beside it.
			l.Unrecognized = "(unreadable: " + err.Error() + ")"
		case err != nil:
			return nil, 0, fmt.Errorf("read %s: %w", l.StoreKey, err)
		}
		if opts.Limit > 0 && len(locks) == opts.Limit {
			more++
			continue
		}
		locks = append(locks, l)
	}
	return locks, more, nil
}

// Lookup implements lockstore.Inspector.
func (in *Inspector) Lookup(ctx context.Context, key string) (lockstore.LockInfo, error) {
	l, _, _, err := in.read(ctx, key)
	if err != nil {
		return lockstore.LockInfo{}, fmt.Errorf("ZooKeeper node %q: %w", in.s.keyPath(in.prefix+key), err)
	}
	return l, nil
}

// read reads the lock of key (no prefix), with its key node's stat and holds; ErrNotHeld when
// it has no node or no holds. Even on error, the lock has its keys and NoTTL.
func (in *Inspector) read(ctx context.Context, key string) (lockstore.LockInfo, *zk.Stat, []string, error) {
	p := in.s.keyPath(in.prefix + key)
	l := lockstore.LockInfo{Key: key, StoreKey: p, TTL: lockstore.NoTTL}
	data, stat, kids, err := in.s.node(ctx, p)
	if errors.Is(err, zk.ErrNoNode) || err == nil && len(kids) == 0 {
		return l, nil, nil, lockstore.ErrNotHeld // released, or left by an expired session
	}
	if err != nil {
		return l, nil, nil, err
	}
	holds := 0
	for _, k := range kids {
		switch h := len(ownerHash("")); {
		case strings.HasPrefix(k, ownPre):
			l.Own = true
		case strings.HasPrefix(k, borrowPre) && len(k) > len(borrowPre)+h+1:
			name, _ := keyOf(k[len(borrowPre)+h+1:]) // "b-<owner hash>-<escaped name>"
			l.Borrowed = append(l.Borrowed, name)
		case strings.HasPrefix(k, readerPre):
			l.Readers++
		default:
			continue // no hold: a child someone else made
		}
		holds++
	}
	if holds == 0 {
		// Children, none a hold: a node someone else made (zkCli), which no Store holds or frees.
		l.Unrecognized = cmp.Or(string(data), lockstore.EmptyValue)
		return l, stat, kids, nil
	}
	_, _, l.Contended = parseValue(data)
	l.Fence = fence(stat.Czxid)
	l.ParseHolder(holderMeta(data))
	slices.Sort(l.Borrowed)
	if line, err := in.s.children(ctx, in.s.linePath(in.prefix+key)); err == nil {
		l.Queued = len(line)
	}
	return l, stat, kids, nil
}

// ForceUnlock implements lockstore.Inspector: one multi deletes the holds of grant l and its key
// node, failing on another grant (creation zxid); 1 notified if it was contended.
func (in *Inspector) ForceUnlock(ctx context.Context, l lockstore.LockInfo) (int, error) {
	p := in.s.keyPath(in.prefix + l.Key)
	for range attempts {
		now, stat, kids, err := in.read(ctx, l.Key)
		if errors.Is(err, lockstore.ErrNotHeld) {
			return 0, &lockstore.ChangedError{}
		}
		if err != nil {
			return 0, err
		}
		if now.Unrecognized != "" {
			return 0, fmt.Errorf("%q is not a flightlock lock", p)
		}
		if now.Fence != l.Fence {
			return 0, &lockstore.ChangedError{Now: &now}
		}
		// The holds node listed are that grant's (the listing's creation zxid is the data's),
		// and a delete of one fails on any node the key gets later.
		ops := make([]any, 0, len(kids)+1)
		for _, k := range kids {
			ops = append(ops, &zk.DeleteRequest{Path: p + "/" + k, Version: -1})
		}
		ops = append(ops, &zk.DeleteRequest{Path: p, Version: stat.Version})
		if _, err := in.s.multi(ctx, nil, ops...); err == nil {
			if now.Contended {
				return 1, nil
			}
			return 0, nil
		}
	}
	return 0, fmt.Errorf("force unlock %s: the lock kept changing", p)
}

// Watch implements lockstore.Inspector by reading the locks every opts.Interval and comparing.
func (in *Inspector) Watch(ctx context.Context, pattern string, opts lockstore.WatchOptions, fn func(lockstore.Event)) error {
	opts = opts.WithDefaults()
	var held map[string]lockstore.LockInfo
	read := func(ctx context.Context) ([]lockstore.LockInfo, error) {
		locks, _, err := in.List(ctx, pattern, lockstore.ListOptions{Skip: opts.Skip})
		if err == nil {
			held, _ = lockstore.Changes(held, locks, fn)
		}
		return locks, err
	}
	return lockstore.PollWatch[any](ctx, opts, "polling every "+opts.Interval.String(), read, nil, nil, fn)
}

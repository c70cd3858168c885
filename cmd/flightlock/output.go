package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/internal/glob"
	"github.com/flightlock/flightlock/lockstore"
)

// printer writes tables for people or JSON for scripts.
type printer struct {
	w    io.Writer
	json bool
}

func (p *printer) encode(v any) error {
	enc := json.NewEncoder(p.w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// quoteIfOdd quotes s when it holds anything but printable, non-space characters. Keys and
// metadata come from requests: a key with terminal escape sequences must not repaint the
// operator's screen, and one with spaces must not shift the columns.
func quoteIfOdd(s string) string {
	if !utf8.ValidString(s) { // a bad byte reads as U+FFFD, which is graphic
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsGraphic(r) || unicode.IsSpace(r) || r == '"' {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

// ownerColumn is the table's OWNER: the start of the token in Redis; in etcd and ZooKeeper,
// where the token is never printed, "-"; for a key held for reading, how many read it.
func ownerColumn(l lockInfo) string {
	switch {
	case l.Readers > 0:
		return readersString(l.Readers)
	case l.Store != "":
		return "-"
	}
	return short(l.Owner)
}

// readersString is "1 reader", "3 readers".
func readersString(n int) string {
	if n == 1 {
		return "1 reader"
	}
	return strconv.Itoa(n) + " readers"
}

// short is the first 8 characters of an owner token: enough to tell holders apart.
func short(owner string) string {
	if len(owner) > 8 {
		return quoteIfOdd(owner[:runeCut(owner, 8)]) + "…"
	}
	return quoteIfOdd(owner)
}

// ttlCell is the table's TTL: ZooKeeper keeps a lock as long as its holder's session.
func ttlCell(l lockInfo) string {
	if l.Store == storeZookeeper {
		return "session"
	}
	return ttlString(l.TTLMillis)
}

func ttlString(ms int64) string {
	if ms < 0 {
		return "none"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func holdsString(l lockInfo) string {
	own := "0"
	if l.Own {
		own = "1"
	}
	if len(l.Reentries) == 0 {
		return own
	}
	return own + "+" + strconv.Itoa(len(l.Reentries))
}

// waitingString says whether others wait: processes subscribed to its release now and requests
// in its fair line, or, without any, that a request was refused while it was held.
func waitingString(l lockInfo) string {
	var parts []string
	if l.Waiters > 0 {
		parts = append(parts, strconv.FormatInt(l.Waiters, 10)+" proc")
	}
	if l.Queued > 0 {
		parts = append(parts, strconv.Itoa(l.Queued)+" in line")
	}
	switch {
	case parts != nil:
		return strings.Join(parts, ", ")
	case l.Contended:
		return "refused"
	}
	return "-"
}

// holderString is the holder's metadata as the table and one-line messages print it; the kind
// only when it is not a plain lock's, the common case.
func holderString(l lockInfo) string {
	kind := l.Kind
	if kind == "lock" {
		kind = ""
	}
	var parts []string
	for _, kv := range [][2]string{{"host", l.Host}, {"pid", l.Pid}, {"trace", l.Trace}, {"kind", kind}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+quoteIfOdd(kv[1]))
		}
	}
	if l.Metadata != "" {
		parts = append(parts, quoteIfOdd(l.Metadata))
	}
	return strings.Join(parts, " ")
}

// lockTable writes locks as a table.
func lockTable(w io.Writer, locks []lockInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tOWNER\tFENCE\tTTL\tHOLDS\tWAITING\tHOLDER")
	for _, l := range locks {
		if l.Unrecognized != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t%s\t-\t-\tnot a flightlock lock: %s\n", quoteIfOdd(l.Key), ttlString(l.TTLMillis),
				quoteIfOdd(truncate(l.Unrecognized, 60)))
			continue
		}
		key := quoteIfOdd(l.Key)
		if l.Shadow {
			key += " (shadow)"
		}
		fence, holds := strconv.FormatInt(l.Fence, 10), holdsString(l)
		if l.Readers > 0 { // each read hold has its own: the key's own hold and fence say nothing
			fence, holds = "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", key, ownerColumn(l), fence, ttlCell(l),
			holds, waitingString(l), holderString(l))
	}
	return tw.Flush()
}

// truncate cuts s to at most n bytes, never inside a character, and marks the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:runeCut(s, n)] + "…"
}

// runeCut is n (< len(s)) moved back to the start of the character it falls in; bytes that are
// no UTF-8 move it at most UTFMax-1 bytes.
func runeCut(s string, n int) int {
	for i := 1; i < utf8.UTFMax && n > 0 && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return n
}

// lockDetail writes one lock in full, a field per line.
func lockDetail(w io.Writer, l lockInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("key", quoteIfOdd(l.Key))
	switch l.Store {
	case storeEtcd:
		row("etcd key", quoteIfOdd(l.EtcdKey))
	case storeZookeeper:
		row("znode", quoteIfOdd(l.ZNode))
	default:
		row("redis key", quoteIfOdd(l.RedisKey))
	}
	if l.Unrecognized != "" {
		row("value", quoteIfOdd(l.Unrecognized)+" (not a flightlock lock)")
		return tw.Flush()
	}
	if l.Shadow {
		row("shadow", "yes: a shadow rule's lock, which holds no request back")
	}
	switch {
	case l.Readers > 0:
		each := "its own hold and TTL"
		if l.Store == storeZookeeper {
			each = "its own hold, for as long as its session"
		}
		row("readers", strconv.Itoa(l.Readers)+" (held for reading: each reader has "+each+", and a write waits for all of them)")
		row("owner", "none (each reader has its own)")
	case l.Store != "":
		row("owner", "not shown (the token would let its bearer re-enter the lock)")
	default:
		row("owner", quoteIfOdd(l.Owner))
	}
	switch l.Store {
	case storeZookeeper:
		if l.Readers == 0 {
			row("fence", strconv.FormatInt(l.Fence, 10)+" (the creation zxid of the key's node, shifted by 16 bits; in-process handoffs count up from it)")
		}
		row("ttl", "none: each hold lives as long as its holder's ZooKeeper session (a dead holder's lock goes when its session expires)")
	case storeEtcd:
		row("fence", fmt.Sprintf("%d (of the etcd grant at revision %d; in-process handoffs count up from it)", l.Fence, l.CreateRevision))
		row("ttl", ttlString(l.TTLMillis)+" left on its lease "+cmp.Or(l.Lease, "(none)")+
			" (whole seconds; the holder's process keeps it alive: a dead holder's lock goes when it runs out)")
		row("revision", fmt.Sprintf("%d (unlock removes the lock only while it is still at this revision)", l.ModRevision))
	default:
		if l.Readers == 0 { // each reader has its own fence: the last handed out for the key (fence counter)
			row("fence", strconv.FormatInt(l.Fence, 10)+" (of the Redis grant; in-process handoffs count up from it)")
		}
		row("ttl", ttlString(l.TTLMillis))
	}
	if l.Readers == 0 {
		row("holds", holdsRow(l))
	}
	// A key held for reading carries the metadata of the reader that came last (Redis; etcd and
	// ZooKeeper keep none for it): not every reader's.
	whose := ""
	if l.Readers > 0 {
		whose = " (of the reader that came last)"
	}
	for _, f := range [][2]string{{"host", l.Host}, {"pid", l.Pid}, {"trace", l.Trace}} {
		if f[1] == "" { // a field the lock does not carry; quoteIfOdd writes "" for an empty key
			row(f[0], "-")
			continue
		}
		row(f[0], quoteIfOdd(f[1])+whose)
	}
	if l.Kind != "" {
		row("kind", kindRow(l.Kind))
	}
	if l.Metadata != "" {
		row("metadata", quoteIfOdd(l.Metadata))
	}
	switch {
	case l.Store == storeEtcd && l.Contended:
		row("waiting", "waiter mark set: a request was refused while it was held (waiters watch the key's deletion; etcd does not count them)")
	case l.Store == storeZookeeper && l.Contended:
		row("waiting", "waiter mark set: a request was refused while it was held (waiters watch the key's node; ZooKeeper does not count them)")
	case l.Waiters > 0:
		row("waiting", fmt.Sprintf("%d process(es) wait for its release", l.Waiters))
	case l.Contended:
		row("waiting", "none now; a request was refused while it was held")
	default:
		row("waiting", "no")
	}
	if l.Queued > 0 {
		row("fair line", fmt.Sprintf("%d request(s) wait to be granted in the order they asked (a fair lock)", l.Queued))
	}
	if l.FenceCounterKey != "" && l.Store == storeEtcd {
		floor := "unset (the grant's revision alone sets its fence)"
		if l.FenceCounter != nil {
			floor = strconv.FormatInt(*l.FenceCounter, 10) + " (the fence of an earlier grant that handed out over 2^21 fences)"
		}
		row("fence floor", quoteIfOdd(l.FenceCounterKey)+" = "+floor)
	} else if l.FenceCounterKey != "" {
		counter := "unset"
		if l.FenceCounter != nil {
			counter = strconv.FormatInt(*l.FenceCounter, 10)
		}
		row("fence counter", l.FenceCounterKey+" = "+counter+" (the next grant in this slot is above it)")
	}
	return tw.Flush()
}

// kindRow is show's kind: what the holder's Locker takes, as it stored it.
func kindRow(kind string) string {
	switch {
	case kind == "lock":
		return "lock"
	case kind == "read":
		return "read (the read side of a read-write lock)"
	case kind == "fair":
		return "fair (granted in the order it was asked for)"
	case strings.HasPrefix(kind, "permits:"):
		return quoteIfOdd(kind) + " (a permit of a semaphore: the key's first permit is the key, the others KEY#...; ls 'KEY*' lists them)"
	}
	return quoteIfOdd(kind)
}

// holdsRow is show's holds: the acquisition's own and the re-entries from other processes.
func holdsRow(l lockInfo) string {
	holds := "the acquisition's own"
	if !l.Own {
		holds = "none of the acquisition's own (given up)"
	}
	if len(l.Reentries) > 0 {
		q := make([]string, len(l.Reentries))
		for i, r := range l.Reentries {
			q[i] = quoteIfOdd(r)
		}
		holds += "; re-entries from other processes: " + strings.Join(q, ", ")
	}
	return holds
}

// cmdList is "ls [pattern]".
func cmdList(ctx context.Context, c *backend, out *printer, o options, pattern string) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	found, more, err := c.List(ctx, pattern, lockstore.ListOptions{Limit: o.limit, Skip: skipKeys(o.shadow)})
	if err != nil {
		return err
	}
	locks := views(found, c.store())
	if out.json {
		return out.encode(locks)
	}
	if len(locks) == 0 {
		line := fmt.Sprintf("no lock held matches %s on %s", quoteIfOdd(c.keyPrefix()+pattern), c.where())
		// A pattern without a glob character is one key: say what the operator may have
		// meant, as show does (the JSON stays the empty list scripts read).
		if pattern != "" && !strings.ContainsAny(pattern, `*?[\`) {
			if hint := meant(ctx, c, pattern); hint != "" {
				line += "; " + hint
			}
		}
		_, err := fmt.Fprintln(out.w, line)
		return err
	}
	if err := lockTable(out.w, locks); err != nil {
		return err
	}
	if more > 0 {
		_, err = fmt.Fprintf(out.w, "... and %d more (-limit 0 lists all)\n", more)
	}
	return err
}

// cmdShow is "show KEY".
func cmdShow(ctx context.Context, c *backend, out *printer, o options, key string) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	l, err := lookupLock(ctx, c, key)
	if err != nil {
		return err
	}
	if out.json {
		err = out.encode(l)
	} else {
		err = lockDetail(out.w, l)
	}
	if err == nil && l.Unrecognized != "" {
		// Printed marked so, and failed as unlock fails on it: a script that asks show
		// whether a key is held reads no foreign value as a lock.
		err = notALock(l)
	}
	return err
}

// lookupLock reads one lock in full; errNotHeld when no one holds it.
func lookupLock(ctx context.Context, c *backend, key string) (lockInfo, error) {
	l, err := c.Lookup(ctx, key)
	if errors.Is(err, lockstore.ErrNotHeld) {
		return lockInfo{}, notHeld(ctx, c, key)
	}
	if err != nil {
		return lockInfo{}, err
	}
	return view(l, c.store()), nil
}

// notALock is the answer of show and unlock for a key under the prefix that flightlock did
// not write (l.Unrecognized): it names the key in its store and its value.
func notALock(l lockInfo) error {
	return fmt.Errorf("%s is not a flightlock lock (value %s)", quoteIfOdd(storeKey(l)), quoteIfOdd(l.Unrecognized))
}

// errNotHeld is the answer of show and unlock for a key that no one holds.
var errNotHeld = errors.New("not held")

// notHeld is errNotHeld for key, with its key in the store and what the operator may have
// meant instead (meant).
func notHeld(ctx context.Context, c *backend, key string) error {
	where := map[string]string{storeEtcd: "etcd key", storeZookeeper: "znode under " + c.target.zk.Root}[c.store()]
	if where == "" {
		where = "Redis key"
	}
	err := fmt.Errorf("%s (%s %q): %w", quoteIfOdd(key), where, c.keyPrefix()+key, errNotHeld)
	if hint := meant(ctx, c, key); hint != "" {
		err = fmt.Errorf("%w; %s", err, hint)
	}
	return err
}

// meant says what an operator who asked for key (show, unlock, or ls without a glob), which no
// one holds, may have meant: the key without the prefix written before it, ls for a glob, or the
// held permits of the key's semaphore when its first permit, the key itself, is free (the others
// are KEY#...). "" when none of these is it. The permits are looked for with one List; a
// failure of it says nothing.
func meant(ctx context.Context, c *backend, key string) string {
	for _, p := range []string{c.keyPrefix(), c.target.prefix} {
		if p != "" && strings.HasPrefix(key, p) && len(key) > len(p) {
			return fmt.Sprintf("keys are written without the prefix %q: did you mean %s?", p, quoteIfOdd(strings.TrimPrefix(key, p)))
		}
	}
	if strings.ContainsAny(key, "*?[") {
		return "show and unlock take one key, not a pattern: flightlock ls " + shellQuote(key)
	}
	permits := make(map[string]bool)
	for i := 2; i <= flightlock.MaxPermits; i++ {
		permits[strings.TrimPrefix(flightlock.PermitKey(c.keyPrefix(), key, i), c.keyPrefix())] = true
	}
	// Every permit key but the first starts with the key, each "#" doubled, and a "#".
	found, _, err := c.List(ctx, glob.Escape(strings.ReplaceAll(key, "#", "##"))+"#*", lockstore.ListOptions{})
	if err != nil {
		return ""
	}
	var held []string
	for _, l := range found {
		if permits[l.Key] {
			held = append(held, quoteIfOdd(l.Key))
		}
	}
	if len(held) == 0 {
		return ""
	}
	return fmt.Sprintf("%d other permits of its semaphore are held: %s (flightlock ls %s)",
		len(held), strings.Join(held, ", "), shellQuote(glob.Escape(key)+"*"))
}

// shellQuote is s in single quotes, for a command the operator can paste.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

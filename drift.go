package flightlock

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// withKind returns an acquisition's metadata with the kind; the default's costs no allocation.
func (l *Locker) withKind(ctx context.Context) string {
	if l.cfg.metadata == nil {
		return l.kindMeta.own
	}
	if !l.cfg.metadataSet {
		if fn := l.cfg.holderFieldValue; fn != nil {
			if v := fn(ctx); v != "" {
				return processHolder + " " + l.cfg.holderFieldName + "=" + v + " " + l.kindMeta.own // one allocation
			}
		}
		return l.kindMeta.withDefault
	}
	if meta := l.cfg.metadata(ctx); meta != "" {
		return meta + " " + l.kindMeta.own
	}
	return l.kindMeta.own
}

// kindMeta is the kind of a Locker's locks as its metadata says it ("kind=permits:3"), so that
// a Lock that finds its key held by an instance configured otherwise (other Permits, Fair beside
// no Fair) reports the drift (Observer.Drift, or the log); the store still decides.
type kindMeta struct {
	own         string // "kind=..."
	withDefault string // DefaultMetadata's with it
}

func newKindMeta(c *config) kindMeta {
	own := "kind=lock"
	switch {
	case c.permits > 1:
		own = "kind=permits:" + strconv.Itoa(c.permits)
	case c.read:
		own = "kind=read"
	case c.fair:
		own = "kind=fair"
	}
	return kindMeta{own: own, withDefault: processHolder + " " + own}
}

// holderKind is the kind a holder's metadata names, or "" (a holder of an older version).
func holderKind(meta string) string {
	i := strings.LastIndex(meta, "kind=")
	if i < 0 || (i > 0 && meta[i-1] != ' ') {
		return ""
	}
	kind, _, _ := strings.Cut(meta[i:], " ")
	return kind
}

// drifted reports whether locks of kinds own and holder cannot be one rule's. Reads meet locks
// and fair locks as the two sides of a read-write lock.
func drifted(own, holder string) bool {
	if holder == "" || own == holder {
		return false
	}
	if own == "kind=read" || holder == "kind=read" {
		return strings.HasPrefix(own, "kind=permits:") || strings.HasPrefix(holder, "kind=permits:")
	}
	return true
}

// driftLogEvery bounds the log lines of a Locker without an Observer.Drift.
const driftLogEvery = time.Minute

// reportDrift tells the Observer, or the log, when key is held by a lock of a drifted kind.
func (l *Locker) reportDrift(ctx context.Context, key, holderMeta string) {
	holder := holderKind(holderMeta)
	if !drifted(l.kindMeta.own, holder) {
		return
	}
	own := strings.TrimPrefix(l.kindMeta.own, "kind=")
	holder = strings.TrimPrefix(holder, "kind=")
	if o := l.cfg.observer; o != nil && o.Drift != nil {
		o.Drift(ctx, key, own, holder)
		return
	}
	now := int64(l.k.nowInstant()) + 1 // monotonic, so that a wall clock's step cannot mute it; 0 is never
	if last := l.k.lastDriftLog.Load(); last != 0 && now-last < int64(driftLogEvery) || !l.k.lastDriftLog.CompareAndSwap(last, now) {
		return
	}
	slog.Warn("flightlock: drift: processes lock one key in two ways; give every instance the same Permits and Fair",
		"key", key, "here", own, "holder", holder, "holder_metadata", holderMeta)
}

package flightlock

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// Mode says what Lock does when the key is busy.
type Mode int

const (
	// Wait (the default) queues for the key (FIFO in the process) until the budget or ctx ends.
	Wait Mode = iota
	// Reject fails at once with ErrBusy, with no store command for a key held in the process.
	Reject
)

func (m Mode) String() string {
	switch m {
	case Wait:
		return "wait"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults of a Locker's options.
const (
	DefaultTTL     = 10 * time.Second
	DefaultWait    = 2 * time.Second
	DefaultMaxHold = time.Minute
	DefaultPrefix  = "lock:"
	// WithHandoff's bounds; the window binds sections of 1ms or more (docs/design-notes.md).
	DefaultHandoff       = 1024
	DefaultHandoffWindow = 20 * time.Millisecond
	// DefaultRetryMin and DefaultRetryMax are the first and the longest delay of DefaultRetry.
	DefaultRetryMin = 5 * time.Millisecond
	DefaultRetryMax = 200 * time.Millisecond
)

// DefaultRetry is ExponentialRetry(DefaultRetryMin, DefaultRetryMax), WithRetry's default.
var DefaultRetry = ExponentialRetry(DefaultRetryMin, DefaultRetryMax)

type config struct {
	ttl              time.Duration
	wait             time.Duration
	maxHold          time.Duration
	retry            Retry
	mode             Mode
	prefix           string
	handoff          int
	window           time.Duration
	failOpen         bool
	permits          int  // WithPermits: more than 1 makes each key a semaphore
	read             bool // WithRead
	fair             bool // WithFair
	metadata         func(context.Context) string
	metadataSet      bool   // WithMetadata was given (else metadata is DefaultMetadata: kindMeta)
	holderFieldName  string // WithHolderField's
	holderFieldValue func(context.Context) string
	holders          func(ctx context.Context, holder string) error
	clock            clock // systemClock outside tests (withClock)
	observer         *Observer
}

func defaultConfig() config {
	return config{
		ttl:      DefaultTTL,
		wait:     DefaultWait,
		maxHold:  DefaultMaxHold,
		retry:    DefaultRetry,
		mode:     Wait,
		prefix:   DefaultPrefix,
		handoff:  DefaultHandoff,
		window:   DefaultHandoffWindow,
		metadata: DefaultMetadata,
		clock:    systemClock{},
	}
}

// processHolder is "host=<hostname> pid=<pid>", each run of blanks in the host name made "_".
var processHolder = func() string {
	host, _ := os.Hostname()
	return "host=" + strings.Join(strings.Fields(host), "_") + " pid=" + strconv.Itoa(os.Getpid())
}()

// DefaultMetadata is what a Locker stores beside each lock unless WithMetadata says otherwise:
// "host=<hostname> pid=<pid>", which the stores' inspectors read back (flightlock show).
func DefaultMetadata(context.Context) string { return processHolder }

// validate refuses, naming it, an option that is bad or that store cannot honour (Capabilities).
func (c *config) validate(store lockstore.Store) error {
	switch {
	case c.ttl <= 0:
		return wrapf(ErrConfig, "WithTTL: must be positive, got %v", c.ttl)
	case c.wait < 0:
		return wrapf(ErrConfig, "WithWait: must not be negative, got %v", c.wait)
	case c.maxHold <= 0:
		return wrapf(ErrConfig, "WithMaxHold: must be positive, got %v", c.maxHold)
	case c.retry == nil:
		return wrapf(ErrConfig, "WithRetry: the retry strategy is nil")
	case c.mode != Wait && c.mode != Reject:
		return wrapf(ErrConfig, "WithMode: unknown mode %v, want Wait or Reject", c.mode)
	case c.handoff < 0 || c.window < 0:
		return wrapf(ErrConfig, "WithHandoff: bounds must not be negative, got %d and %v", c.handoff, c.window)
	case len(c.prefix) >= MaxKeyLen:
		return wrapf(ErrConfig, "WithPrefix: the prefix is %d bytes, the whole key may have %d", len(c.prefix), MaxKeyLen)
	case c.permits < 0 || c.permits > MaxPermits:
		return wrapf(ErrConfig, "WithPermits: must be 1 to %d (0 means 1), got %d", MaxPermits, c.permits)
	case (c.read || c.fair) && c.permits > 1:
		return wrapf(ErrConfig, "WithPermits: a semaphore cannot be a read lock or fair (WithRead, WithFair)")
	case c.read && c.fair:
		return wrapf(ErrConfig, "WithFair: read locks share, so they have no order to keep; only write locks are fair")
	case (c.read || c.fair) && c.failOpen:
		return wrapf(ErrConfig, "WithFailOpen: a read or fair lock has no per-process gate to fall back on")
	}
	caps := store.Capabilities()
	if err := caps.CheckTTL(c.ttl); err != nil {
		return wrapf(ErrConfig, "WithTTL: %v", err)
	}
	if caps.MaxHandoffs > 0 && c.handoff > caps.MaxHandoffs {
		return wrapf(ErrConfig, "WithHandoff: %d handoffs in a row is more than this store's fences allow (%d)",
			c.handoff, caps.MaxHandoffs)
	}
	return nil
}

// Option configures a Locker; New and With refuse a bad one with an ErrConfig naming it.
type Option func(*config)

// WithTTL sets the lease TTL (default 10s), how long the lock outlives a holder that died; a
// watchdog renews it every TTL/3 while the holder runs. It must be positive.
func WithTTL(ttl time.Duration) Option { return func(c *config) { c.ttl = ttl } }

// WithWait sets the wait budget of wait mode (default 2s): the longest a Lock waits for a busy
// key before it returns ErrBusy. The context's deadline shortens it, less a reserve for the busy
// answer to reach the caller in time: a tenth of the time left, from 1ms to 100ms.
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithMaxHold bounds how long one holder keeps a lock (default 1m): the watchdog stops
// renewing after it, and the lease is lost one TTL later.
func WithMaxHold(d time.Duration) Option { return func(c *config) { c.maxHold = d } }

// WithRetry sets the retry strategy for a lock held elsewhere (default DefaultRetry).
func WithRetry(r Retry) Option { return func(c *config) { c.retry = r } }

// WithMode sets what Lock does with a busy key (default Wait). TryLock always rejects.
func WithMode(m Mode) Option { return func(c *config) { c.mode = m } }

// WithPrefix sets the prefix of every store key (default "lock:").
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithHandoff bounds the handoff of a released lock to the next local waiter, with no round trip:
// fewer than n in a row, and less than within after the store acquisition (defaults 1024 and 20ms);
// then the turn ends in the store, so that other processes get theirs. n = 0 disables handoff; n
// counts as at most 65,535, and as fewer than the TTL has microseconds (docs/guarantees.md).
func WithHandoff(n int, within time.Duration) Option {
	return func(c *config) { c.handoff, c.window = n, within }
}

// WithFailOpen makes Lock answer a store that cannot be reached with a degraded lease
// (Lease.Degraded, Fence 0) instead of its error: it excludes the goroutines of this Locker and its
// derived Lockers, not other processes. Busy keys, bad keys and ended contexts never degrade.
func WithFailOpen(on bool) Option { return func(c *config) { c.failOpen = on } }

// WithMetadata sets a function whose result is stored beside the owner token, so an operator
// can see who holds a lock (default DefaultMetadata; nil stores nothing), followed by the kind
// of the Locker's locks ("kind=permits:3"), for other processes to see drift (Observer.Drift).
// It must not contain newlines; it is called once per store acquisition.
func WithMetadata(fn func(ctx context.Context) string) Option {
	return func(c *config) { c.metadata, c.metadataSet, c.holderFieldValue = fn, true, nil }
}

// WithHolderField stores name=value after DefaultMetadata ("host=pod-7 pid=311 trace=4bf9...")
// beside each lock, value being fn's for the acquisition's context (empty adds nothing), in one
// allocation. It replaces WithMetadata, and WithMetadata replaces it.
func WithHolderField(name string, fn func(ctx context.Context) string) Option {
	return func(c *config) {
		c.metadata, c.metadataSet = DefaultMetadata, false
		c.holderFieldName, c.holderFieldValue = name, fn
	}
}

// WithHolderCheck sets a function that a Lock calls when the key it wants is held by another
// owner, with the holder's metadata (skipped when there is none). A non-nil error ends the
// Lock at once, as ErrBusy wrapping that error: the go-zero layer uses it to tell a nested
// call that would wait for its own caller (the same trace id) from real contention.
func WithHolderCheck(fn func(ctx context.Context, holder string) error) Option {
	return func(c *config) { c.holders = fn }
}

// Observer is told what a Locker's locks do that its callers cannot see. Each func may be nil.
// They run synchronously on the event's goroutine (Lost with the lock's state locked): they
// must be quick and must not call into the Locker.
type Observer struct {
	// Retry is called before a waiting Lock sleeps after its attempt-th busy answer;
	// holderTTL is what the holder had left.
	Retry func(ctx context.Context, key string, attempt int, holderTTL time.Duration)
	// Renewed is called after each watchdog renewal, with the store's error (nil on success).
	Renewed func(key string, err error)
	// Lost is called once when a lock can no longer be trusted (its leases end with ErrLost).
	Lost func(key string)
	// Abandoned is called, on a renewer, when a lost grant is given up with a lease never
	// released (a forgotten Release, a handler stuck past MaxHold); at is where it was taken,
	// "file:line (function)". Without it the report is an error line of log/slog.
	Abandoned func(key, at string)
	// Drift is called when a Lock finds key held by a lock of a kind that cannot be the same
	// rule's: another permit count ("permits:3" here, "lock" there), or a fair lock beside an
	// unfair one. Without it, drift is logged at most once a minute.
	Drift func(ctx context.Context, key, here, holder string)
}

// WithObserver installs an Observer for the locks taken through the Locker.
func WithObserver(o Observer) Option { return func(c *config) { c.observer = &o } }

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

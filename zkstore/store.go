package zkstore

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/lockstore"
)

// Defaults of Config.
const (
	DefaultRoot = "/flightlock"
	// DefaultSessionTimeout is ZooKeeper's default maxSessionTimeout (20 ticks), leaving a
	// MaxTTL of 14.7s with the default tick and syncLimit, above the Locker's default TTL.
	DefaultSessionTimeout = 40 * time.Second
	// DefaultTickTime and DefaultSyncLimit are ZooKeeper's sample configuration's, assumed when
	// the servers do not answer the "conf" four-letter word and Config does not say.
	DefaultTickTime  = 2 * time.Second
	DefaultSyncLimit = 5
)

// Config is what the store needs to know of the ensemble and its session; its go-zero tags
// serve zkconf.Conf, a service's Lock.Zookeeper section.
type Config struct {
	Hosts []string `json:",optional"` // the servers, "host:port"
	// SessionTimeout (default DefaultSessionTimeout) bounds the lock TTL (MaxTTL), and is
	// checked against the ensemble's settings (see the package doc).
	SessionTimeout time.Duration `json:",default=40s"`
	Root           string        `json:",default=/flightlock"` // the locks' parent, made if missing
	// TickTime and SyncLimit are the ensemble's, used when its servers do not answer the
	// "conf" four-letter word (4lw.commands.whitelist); zero means the defaults.
	TickTime  time.Duration `json:",optional"`
	SyncLimit int           `json:",optional"`
}

type ensemble struct {
	tick                   time.Duration
	syncLimit              int
	minSession, maxSession time.Duration // zero when unknown
	fromServer             string        // the server that answered "conf", "" when the settings are Config's
}

// Store is the lockstore.Store on a ZooKeeper session, made by Dial (or New on the caller's
// connection). It is safe for concurrent use.
type Store struct {
	conn    *zk.Conn
	owned   bool // Dial made conn: Close closes it
	root    string
	session time.Duration
	maxTTL  time.Duration
	acl     []zk.ACL
	closed  atomic.Bool

	mu sync.Mutex
	// reservedSeen is when this store first saw each key node (by path and mzxid) the last reader
	// left to a waiting writer: readers wait writerReserve from then, by this process's clock.
	reservedSeen map[string]time.Time // guarded by mu
	// holds are the hold nodes this store made and did not release, per key node and owner:
	// what Refresh checks (on this session, they prove it lives); under a line, its places.
	holds map[holdKey][]string // guarded by mu
	// unsure are, alike, the holds a request whose reply was lost may have made: releaseLater
	// gives them back, but Refresh ignores them (a handed-over owner's grant may be this store's).
	unsure map[holdKey][]string // guarded by mu
}

type holdKey struct{ node, owner string }

var _ lockstore.Store = (*Store)(nil)

var errStoreClosed = errors.New("flightlock: zookeeper store closed")

// Dial checks the session timeout against the ensemble's settings, connects and waits (at
// most a session timeout) for a session. Close ends the session.
func Dial(cfg Config) (*Store, error) {
	if len(cfg.Hosts) == 0 {
		return nil, errors.New("flightlock: zookeeper: no hosts")
	}
	cfg, ens, err := settle(cfg)
	if err != nil {
		return nil, err
	}
	conn, events, err := zk.Connect(cfg.Hosts, cfg.SessionTimeout, zk.WithLogger(log.New(io.Discard, "", 0)))
	if err != nil {
		return nil, fmt.Errorf("flightlock: zookeeper: connect %v: %w", cfg.Hosts, err)
	}
	deadline := time.After(cfg.SessionTimeout)
	for up := false; !up; {
		select {
		case ev := <-events:
			up = ev.State == zk.StateHasSession
		case <-deadline:
			conn.Close()
			return nil, fmt.Errorf("flightlock: zookeeper: no session with %v within %v", cfg.Hosts, cfg.SessionTimeout)
		}
	}
	go func() { // the client blocks on a full event channel
		for range events {
		}
	}()
	s, err := newStore(conn, cfg, ens)
	if err != nil {
		conn.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// New returns the store on the caller's conn, made with cfg.SessionTimeout (Close leaves it
// open); cfg.Hosts, if set, are asked for the ensemble's settings.
func New(conn *zk.Conn, cfg Config) (*Store, error) {
	cfg, ens, err := settle(cfg)
	if err != nil {
		return nil, err
	}
	return newStore(conn, cfg, ens)
}

func newStore(conn *zk.Conn, cfg Config, ens ensemble) (*Store, error) {
	root := strings.TrimRight(cfg.Root, "/")
	if !strings.HasPrefix(root, "/") || strings.Contains(root, "//") {
		return nil, fmt.Errorf("flightlock: zookeeper: root %q must be an absolute path", cfg.Root)
	}
	s := &Store{
		conn: conn, root: root, session: cfg.SessionTimeout, maxTTL: maxTTL(cfg.SessionTimeout, ens.tick, ens.syncLimit),
		acl: zk.WorldACL(zk.PermAll), holds: make(map[holdKey][]string),
		unsure:       make(map[holdKey][]string),
		reservedSeen: make(map[string]time.Time),
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.SessionTimeout)
	defer cancel()
	if err := s.ensurePath(ctx, s.root); err != nil {
		return nil, err
	}
	return s, nil
}

// settle fills cfg's defaults, reads the ensemble's settings and checks the session timeout.
func settle(cfg Config) (Config, ensemble, error) {
	cfg.SessionTimeout, cfg.Root = cmp.Or(cfg.SessionTimeout, DefaultSessionTimeout), cmp.Or(cfg.Root, DefaultRoot)
	ens := readEnsemble(cfg)
	return cfg, ens, checkSession(cfg.SessionTimeout, ens)
}

// maxTTL is the longest lock TTL a session of timeout session keeps (see the package doc).
func maxTTL(session, tick time.Duration, syncLimit int) time.Duration {
	return session*2/3 - time.Duration(syncLimit+1)*tick
}

// checkSession refuses a timeout the servers would change or a cut-off follower outlasts.
func checkSession(session time.Duration, ens ensemble) error {
	from := "assumed (Config.TickTime, Config.SyncLimit; the servers do not answer \"conf\")"
	if ens.fromServer != "" {
		from = "read from " + ens.fromServer
	}
	switch window := time.Duration(ens.syncLimit)*ens.tick + ens.tick; {
	case session <= 0:
		return fmt.Errorf("flightlock: zookeeper: session timeout %v must be positive", session)
	case ens.minSession > 0 && session < ens.minSession, ens.maxSession > 0 && session > ens.maxSession:
		return fmt.Errorf("flightlock: zookeeper: session timeout %v is outside the servers' %v to %v, which they would clamp it to without a word",
			session, ens.minSession, ens.maxSession)
	case session <= window:
		return fmt.Errorf("flightlock: zookeeper: session timeout %v is not longer than syncLimit x tickTime + tickTime = %v (%s): a follower cut off from the quorum keeps its clients that long, and their sessions would expire before they can move",
			session, window, from)
	case maxTTL(session, ens.tick, ens.syncLimit) < time.Second:
		return fmt.Errorf("flightlock: zookeeper: session timeout %v leaves less than a second of lock TTL (two thirds of it less syncLimit + 1 ticks: tickTime %v, syncLimit %d, %s)",
			session, ens.tick, ens.syncLimit, from)
	}
	return nil
}

// readEnsemble asks the servers for their settings ("conf"), else takes cfg's.
func readEnsemble(cfg Config) ensemble {
	ens := ensemble{tick: cfg.TickTime, syncLimit: cfg.SyncLimit}
	if ens.tick <= 0 {
		ens.tick = DefaultTickTime
	}
	if ens.syncLimit <= 0 {
		ens.syncLimit = DefaultSyncLimit
	}
	for _, h := range cfg.Hosts {
		conf, err := fourLetter(h, "conf", 3*time.Second)
		if err != nil || len(conf) == 0 { // a server busy starting up: once more
			conf, err = fourLetter(h, "conf", 3*time.Second)
		}
		if err != nil {
			continue
		}
		tick, err := strconv.ParseInt(conf["tickTime"], 10, 64)
		if err != nil {
			continue // "conf is not executed because it is not in the whitelist", or a stranger
		}
		millis := func(name string) time.Duration { // 0 when absent or not a positive number
			if n, err := strconv.ParseInt(conf[name], 10, 64); err == nil && n > 0 {
				return time.Duration(n) * time.Millisecond
			}
			return 0
		}
		sync, _ := strconv.ParseInt(conf["syncLimit"], 10, 64) // absent when standalone: no follower
		ens.tick, ens.syncLimit, ens.fromServer = time.Duration(tick)*time.Millisecond, int(sync), h
		ens.minSession, ens.maxSession = millis("minSessionTimeout"), millis("maxSessionTimeout")
		return ens
	}
	// No server told its bounds: assume ZooKeeper's defaults for the tick (2 and 20 ticks).
	ens.minSession, ens.maxSession = 2*ens.tick, 20*ens.tick
	return ens
}

// fourLetter sends a four-letter word to the server at addr and reads its "name=value" lines.
func fourLetter(addr, word string, timeout time.Duration) (map[string]string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, word); err != nil {
		return nil, err
	}
	out := make(map[string]string)
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out, nil
}

// MaxTTL is the longest lock TTL the store accepts (see the package doc).
func (s *Store) MaxTTL() time.Duration { return s.maxTTL }

// Capabilities implements lockstore.Store: MaxTTL, and 16 bits of fences per grant for handoffs.
func (s *Store) Capabilities() lockstore.Capabilities {
	return lockstore.Capabilities{
		Name:        "zookeeper",
		MaxHandoffs: 1<<fenceShift - 1,
		MaxTTL:      s.maxTTL,
		MaxTTLReason: fmt.Sprintf("this ZooKeeper session keeps a lock (%v: two thirds of the %v session timeout less syncLimit + 1 ticks); shorten the TTL or lengthen the session",
			s.maxTTL, s.session),
	}
}

// fenceShift is how far a creation zxid is shifted to make a fence. zxids carry the leader's
// epoch in their top 32 bits; 16 more leave 2^15 elections before a fence overflows.
const fenceShift = 16

func fence(czxid int64) int64 { return czxid << fenceShift }

// Conn returns the ZooKeeper connection the store runs on.
func (s *Store) Conn() *zk.Conn { return s.conn }

// Root returns the node the locks live under.
func (s *Store) Root() string { return s.root }

// Close ends the session when Dial made it, and the session's holds with it: drain the
// Lockers on the store first (flightlock.Locker.Drain).
func (s *Store) Close() error {
	if !s.closed.Swap(true) && s.owned {
		s.conn.Close()
	}
	return nil
}

func (s *Store) keyPath(key string) string { return s.root + "/" + nodeName(key) }

// linePath is the node of key's fair line, beside the key node: no escaped key has a ".".
func (s *Store) linePath(key string) string { return s.keyPath(key) + ".line" }

// nodeName escapes key into one node name (bytes but ASCII letters, digits and "-_:@=+," as %XX),
// never several nodes ("orders/0" stays beside "orders"), "." or "..", nor another key's.
func nodeName(key string) string {
	var b strings.Builder
	b.Grow(len(key))
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_:@=+,", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte("0123456789ABCDEF"[c>>4])
		b.WriteByte("0123456789ABCDEF"[c&15])
	}
	return b.String()
}

// keyOf is the key a node name escapes; false for a name nodeName does not make.
func keyOf(name string) (string, bool) {
	if strings.ContainsAny(name, "./") {
		return "", false
	}
	key, err := url.PathUnescape(name)
	return key, err == nil
}

// ownerHash names an owner in the tree without giving its token away: 128 bits of its SHA-256.
func ownerHash(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// Hold node names, each named for its owner (ownerHash; see the package doc).
const (
	ownPre     = "o-" // the acquisition's hold: "o-<owner hash>"
	borrowPre  = "b-" // a re-entry from another process: "b-<owner hash>-<escaped hold name>"
	readerPre  = "r-" // a read hold: "r-<reader's owner hash>"
	placePre   = "p-" // a place in a fair line
	readersTag = "~r" // the key node's owner while readers hold it
	writerTag  = "~w" // left by the last reader to the writer that waited
	markSuffix = " ~" // someone was refused while the lock was held
)

// holdName is the node name of owner's hold: its read hold, else the own ("") or re-entry hold.
func holdName(owner, hold string) string {
	switch h := ownerHash(owner); {
	case lockstore.IsReadOwner(owner):
		return readerPre + h
	case hold != "":
		return borrowPre + h + "-" + nodeName(hold)
	default:
		return ownPre + h
	}
}

// value is a key node's data: "<owner hash>[ <metadata>][ ~]".
func value(owner, meta string) []byte {
	meta = strings.TrimRight(strings.TrimSpace(strings.ReplaceAll(meta, "\n", " ")), " ~")
	if meta == "" {
		return []byte(owner)
	}
	return []byte(owner + " " + meta)
}

// parseValue splits a key node's data into the owner hash, the metadata and the mark.
func parseValue(data []byte) (owner, meta string, marked bool) {
	v, marked := strings.CutSuffix(string(data), markSuffix)
	owner, meta, _ = strings.Cut(v, " ")
	return owner, meta, marked
}

// check refuses a closed store, what lockstore.CheckArgs refuses and a TTL above MaxTTL.
func (s *Store) check(key, owner string, ttl time.Duration) error {
	if s.closed.Load() {
		return errStoreClosed
	}
	if err := lockstore.CheckArgs(key, owner, ttl); err != nil {
		return err
	}
	if ttl > s.maxTTL {
		return fmt.Errorf("flightlock: %w", s.Capabilities().CheckTTL(ttl))
	}
	return nil
}

// remember records a hold node this store made, rememberUnsure one a lost reply may have made;
// forget drops both, as a hold released or found gone is neither.
func (s *Store) remember(node, owner, hold string)       { s.addHold(s.holds, node, owner, hold) }
func (s *Store) rememberUnsure(node, owner, hold string) { s.addHold(s.unsure, node, owner, hold) }

// addHold adds hold to m (s.holds or s.unsure, guarded by s.mu) once.
func (s *Store) addHold(m map[holdKey][]string, node, owner, hold string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := holdKey{node, owner}
	if !slices.Contains(m[k], hold) {
		m[k] = append(m[k], hold)
	}
}

func (s *Store) forget(node, owner, hold string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := holdKey{node, owner}
	for _, m := range []map[holdKey][]string{s.holds, s.unsure} {
		m[k] = slices.DeleteFunc(m[k], func(h string) bool { return h == hold })
		if len(m[k]) == 0 {
			delete(m, k)
		}
	}
}

// holdsOf returns the hold nodes this store made for owner under node.
func (s *Store) holdsOf(node, owner string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.holds[holdKey{node, owner}])
}

// mayHold reports whether hold node name of owner under node is, or may be (unsure), this
// store's: what a release retried in the background still gives back.
func (s *Store) mayHold(node, owner, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := holdKey{node, owner}
	return slices.Contains(s.holds[k], name) || slices.Contains(s.unsure[k], name)
}

// call runs fn, a call of the ZooKeeper client (which takes no context), until it returns or ctx
// ends. late, if not nil, gets fn's outcome after ctx ended, to give back what it took.
func call[T any](ctx context.Context, fn func() (T, error), late func(T, error)) (T, error) {
	if ctx.Done() == nil {
		return fn()
	}
	if err := ctx.Err(); err != nil {
		var zero T
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		if late != nil {
			go func() {
				r := <-done
				late(r.v, r.err)
			}()
		}
		var zero T
		return zero, ctx.Err()
	}
}

// multi runs ops as one transaction and returns the first operation's error that made it fail.
func (s *Store) multi(ctx context.Context, late func([]zk.MultiResponse, error), ops ...any) ([]zk.MultiResponse, error) {
	res, err := call(ctx, func() ([]zk.MultiResponse, error) { return s.conn.Multi(ops...) }, late)
	return res, opError(res, err)
}

// opError is the error of the operation that failed a multi (not the others' roll-back), or err.
func opError(res []zk.MultiResponse, err error) error {
	for _, r := range res {
		if r.Error != nil && !errors.Is(r.Error, zk.ErrAPIError) {
			return r.Error
		}
	}
	return err
}

// call2 is call, without late, for a client call with two results.
func call2[A, B any](ctx context.Context, fn func() (A, B, error)) (A, B, error) {
	type pair struct {
		a A
		b B
	}
	p, err := call(ctx, func() (pair, error) {
		a, b, err := fn()
		return pair{a, b}, err
	}, nil)
	return p.a, p.b, err
}

func (s *Store) get(ctx context.Context, path string) ([]byte, *zk.Stat, error) {
	return call2(ctx, func() ([]byte, *zk.Stat, error) { return s.conn.Get(path) })
}

func (s *Store) delete(ctx context.Context, path string, version int32) error {
	_, err := call(ctx, func() (struct{}, error) { return struct{}{}, s.conn.Delete(path, version) }, nil)
	return err
}

func (s *Store) children(ctx context.Context, path string) ([]string, error) {
	kids, _, err := call2(ctx, func() ([]string, *zk.Stat, error) { return s.conn.Children(path) })
	return kids, err
}

// node reads key node p's data, stat and holds in one round trip, again until both reads saw
// the same node (creation zxid): the server may answer them either side of a change of hands.
func (s *Store) node(ctx context.Context, p string) ([]byte, *zk.Stat, []string, error) {
	for range attempts {
		var (
			kids  []string
			kstat *zk.Stat
			kerr  error
			wg    sync.WaitGroup
		)
		wg.Go(func() {
			kids, kstat, kerr = call2(ctx, func() ([]string, *zk.Stat, error) { return s.conn.Children(p) })
		})
		data, stat, err := s.get(ctx, p)
		wg.Wait()
		if err == nil {
			err = kerr
		}
		if err != nil || stat.Czxid == kstat.Czxid {
			return data, stat, kids, err
		}
	}
	return nil, nil, nil, fmt.Errorf("flightlock: read %s: the key node kept changing", p)
}

// ensurePath creates path and its parents as persistent nodes where missing.
func (s *Store) ensurePath(ctx context.Context, path string) error {
	for i := 1; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		_, err := call(ctx, func() (string, error) { return s.conn.Create(path[:i], nil, zk.FlagPersistent, s.acl) }, nil)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("flightlock: zookeeper: create %s: %w", path[:i], err)
		}
	}
	return nil
}

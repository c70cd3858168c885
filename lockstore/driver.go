package lockstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Driver is a store's configuration section (Lock.Redis, ...), owned by the store's package;
// the go-zero layer validates and opens every section through it, as database/sql does its drivers.
type Driver interface {
	// Name is the store's name in rules and metrics: "redis", "etcd", "zookeeper".
	Name() string
	// Configured reports whether the section names a store to connect to (its hosts).
	Configured() bool
	// Validate returns every bad setting, each a *ConfigError named by its path under section
	// ("Lock.Etcd.Hosts[1]"). prefix is the lock prefix (the store's keys' after KeyPrefix).
	Validate(section, prefix string) []error
	// Check refuses with a *ConfigError a use the store cannot serve: a rule locking in it when
	// the section names none, a share rule where no responses are kept, a TTL it cannot keep.
	Check(section string, u Use) error
	// KeyPrefix is what goes before a rendered key in the store: prefix, or with the store's
	// namespace in front (etcd's Key). Open, the go-zero layer and the CLI take it from here.
	KeyPrefix(prefix string) string
	// Open connects to the store and returns it as a Backend for the keys under
	// KeyPrefix(prefix); it fails, naming the field, when the section names none.
	Open(prefix string) (*Backend, error)
}

// Use is one use of a store that Driver.Check judges: the section's lock TTL, or one rule.
type Use struct {
	Field    string        // the rule's path, "Lock.Rules[2]"; empty for the section's TTL
	TTLField string        // the setting TTL comes from, "Lock.TTL" or "Lock.Rules[2].TTL"; empty: no TTL to check
	TTL      time.Duration // the lock TTL
	Share    bool          // the rule keeps responses (OnBusy share)
}

// On names u in messages: "the locks run on", or the rule's path and "runs on".
func (u Use) On() string {
	if u.Field == "" {
		return "the locks run on"
	}
	return u.Field + " runs on"
}

// Backend is what the layers above need of an opened (or self-describing, Describer) store.
type Backend struct {
	Name  string // as Driver.Name
	Store Store  // for the Locker
	// Prefix is what the Locker puts before rendered keys: Driver.KeyPrefix's.
	Prefix string
	// Inspector reads the locks under Prefix, for tools; nil when the store has none.
	Inspector Inspector
	// Responses keeps share rules' responses under Prefix; nil if the store cannot (ZooKeeper).
	Responses ResponseStore
	// Close closes the store and the client Open built; nil for a store given in Go, which its
	// owner closes.
	Close func() error
	// CloseEndsHolds reports that Close ends the held locks at once (ZooKeeper) instead of
	// leaving them to their TTL.
	CloseEndsHolds bool
}

// Describer is a Store that describes itself as a Backend (Close nil) for keys under prefix, so
// that one built in Go tells the middleware its name and response store, as this module's do.
type Describer interface {
	Describe(prefix string) *Backend
}

// ResponseStore keeps share rules' responses (OnBusy share) for their duplicates elsewhere, in
// the rule's store, under keys relative to the Backend's Prefix. A record is a JSON object
// ending with "f", the producing grant's fence, and a string "p" (as middleware/share writes
// it); a store may put a field of its own in front, which a reader ignores.
type ResponseStore interface {
	// Load returns the record stored under key, nil when there is none.
	Load(ctx context.Context, key string) ([]byte, error)
	// Save stores record under key for at least ttl, never over a non-record (a lock whose key
	// renders as this one) nor a later grant's record (a fence above fence; 0 compares nothing).
	Save(ctx context.Context, key string, record []byte, fence int64, ttl time.Duration) error
}

// ErrConfig is flightlock.ErrConfig: a configuration that cannot run.
var ErrConfig = errors.New("flightlock: invalid configuration")

// ConfigError is a bad setting. Its message starts with the setting's YAML path
// ("Lock.Etcd.Hosts[1]: is empty"), and errors.Is matches both ErrConfig and what Err wraps.
type ConfigError struct {
	Field string // "Lock.Rules[1].OnBusy"
	Err   error  // what is wrong with it
}

func (e *ConfigError) Error() string   { return e.Field + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() []error { return []error{ErrConfig, e.Err} }

// FieldError is a *ConfigError for field, its message formatted as fmt.Errorf does.
func FieldError(field, format string, args ...any) error {
	return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
}

// TrimHosts returns hosts (a section's servers) trimmed of spaces, without the empty ones.
func TrimHosts(hosts []string) []string {
	var out []string
	for _, h := range hosts {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// HostErrors returns a *ConfigError for each empty or blank entry of hosts, named field[i].
func HostErrors(field string, hosts []string) []error {
	var errs []error
	for i, h := range hosts {
		if strings.TrimSpace(h) == "" {
			errs = append(errs, FieldError(fmt.Sprintf("%s[%d]", field, i), "is empty"))
		}
	}
	return errs
}

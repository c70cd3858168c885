package rules

import (
	"cmp"
	"net/http"

	"github.com/flightlock/flightlock"
)

// checkLockKind validates Mode and Fair against the rest of a rule (as CheckLockSettings), in
// the rule's own words for what flightlock.New would refuse.
func checkLockKind(name string, r Rule, storeErrors string) error {
	if err := OneOf(name+".Mode", r.Mode, ModeRead, ModeWrite); err != nil {
		return err
	}
	read := r.Mode == ModeRead
	switch {
	case r.Mode != "" && r.Permits > 1:
		return FieldError(name+".Permits", "cannot be set with Mode %s: permits beyond the first are keys apart from the read-write lock "+
			"of the key, so they would exclude neither reads nor writes; drop Permits, or Mode for a semaphore", r.Mode)
	case read && r.Method != "" && r.Method != http.MethodGet && r.Method != http.MethodHead && !r.ReadOnly:
		// Read-locked writes would run together, silently.
		return FieldError(name+".Mode", "is read on %s, a method whose requests usually write, and reads run beside each other: "+
			"use Mode write (or leave Mode out) for a handler that writes, or set ReadOnly: true on the rule if this %s only reads", r.Method, r.Method)
	case r.ReadOnly && !read:
		return FieldError(name+".ReadOnly", "is set on a rule without Mode read: it only lets a read rule be on a method other than GET or HEAD")
	case read && r.Fair:
		return FieldError(name+".Fair", "cannot be set with Mode read: reads of a key run together, there is no line to keep; "+
			"set Fair on the write rules, or drop it")
	case read && r.OnBusy == OnBusyShare:
		return FieldError(name+".OnBusy", "cannot be share with Mode read: a shared response is one run's, and reads of a key "+
			"run together anyway; use wait or reject")
	case r.Fair && r.Permits > 1:
		return FieldError(name+".Fair", "cannot be set with Permits: a semaphore of %d permits keeps no line; drop Fair or Permits", r.Permits)
	}
	if !read && !r.Fair {
		return nil
	}
	what := "a read lock"
	if !read {
		what = "a fair lock"
	}
	// Read and fair locks are taken outside the per-process gate a rule falling open runs under.
	switch {
	case r.OnStoreError == StoreErrorsOpen:
		return FieldError(name+".OnStoreError", "cannot be open for %s: it has no per-process lock to fall back on "+
			"when the store is down; set closed", what)
	case r.OnStoreError == "" && storeErrors == StoreErrorsOpen:
		return FieldError(name+".OnStoreError", "is empty, so the rule follows Lock.OnStoreError: open, and %s has no "+
			"per-process lock to fall back on when the store is down; set OnStoreError: closed on the rule", what)
	}
	return nil
}

// LockOptions are the flightlock options of r's own settings, normalized and checked.
func (r Rule) LockOptions() []flightlock.Option {
	var opts []flightlock.Option
	if r.TTL > 0 {
		opts = append(opts, flightlock.WithTTL(r.TTL))
	}
	if r.Wait > 0 {
		opts = append(opts, flightlock.WithWait(r.Wait))
	}
	if r.Permits > 1 {
		opts = append(opts, flightlock.WithPermits(r.Permits))
	}
	if r.Mode == ModeRead {
		opts = append(opts, flightlock.WithRead())
	}
	if r.Fair {
		opts = append(opts, flightlock.WithFair())
	}
	return opts
}

// LockMode is the mode r's locks take, as traces and tools name it: "read" for Mode read,
// "write" for every other rule (plain locks and permits exclude as a write does).
func (r Rule) LockMode() string { return cmp.Or(r.Mode, ModeWrite) }

package main

import "fmt"

// Kinds of lock on one key: the rules that lock keys of one shape make one promise between
// them only when they agree on how they take the key. checkPermitCounts compares their
// Permits; these compare Fair, and look for read locks that no rule writes under.

// ruleName is a counted key's rule as a message names it, with its file:line when it sits in
// another file than the rule the message is about.
func (k countedKey) ruleName(about countedKey) string {
	name := k.s.field(fmt.Sprintf("Lock.Rules[%d]", k.rule))
	if k.s.file != about.s.file {
		name += fmt.Sprintf(" (%s:%d)", k.s.file, k.s.ruleNode(k.rule, "Key").Line)
	}
	return name
}

// checkFairness refuses rules that lock keys of one shape, some with Fair and some without.
// Only fair rules keep the key's line: a request of a rule without Fair takes the key whenever
// it is free, ahead of every fair waiter, so the fair rules' promise of request order does not
// hold. Rules with different Permits lock different keys (checkPermitCounts says so) and are
// not compared, nor are read rules, which cannot be fair: a writer that waits holds new reads
// back whatever its rule (writer preference). The first rule to lock a shape sets it; each later rule that differs is
// reported once per shape.
func (c *checker) checkFairness() {
	type scope struct {
		prefix, shape string
		permits       int
	}
	first := make(map[scope]countedKey)
	reported := make(map[string]bool)
	for _, k := range c.counted {
		sc := scope{k.prefix, k.shape, k.permits}
		f, ok := first[sc]
		if !ok || f.mode == "read" {
			first[sc] = k // the first rule that can be fair sets the shape's
			continue
		}
		id := fmt.Sprintf("%s\x00%s\x00%d\x00%s", k.s.file, k.s.path, k.rule, k.shape)
		if f.fair == k.fair || k.mode == "read" || reported[id] || f.s == k.s { // one section's: Problems refuses them
			continue
		}
		reported[id] = true
		name := k.s.field(fmt.Sprintf("Lock.Rules[%d]", k.rule))
		with, unfair := "with Fair, and %s without it", f.ruleName(k)
		if !k.fair {
			with, unfair = "without Fair, and %s with it", name
		}
		c.errorAt(k.s, k.s.ruleNode(k.rule, "Fair", "Key"), "%s locks %s "+with+": only fair rules keep the key's line, so a request "+
			"of %s takes the key whenever it is free, ahead of the fair waiters; make every rule on a key fair, or none",
			name, k.shape, f.ruleName(k), unfair)
	}
}

// checkReadsWritten notes a key shape that rules lock with Mode read and no rule writes under
// (Mode write, or a lock without Mode and Permits), in every file given: a read lock excludes
// writes only, so alone it holds no request back. The writes may be locked by a service whose
// config was not given to check, hence the wording. It is reported once per shape, at the
// first read rule.
func (c *checker) checkReadsWritten() {
	type scope struct{ prefix, shape string }
	written := make(map[scope]bool)
	for _, k := range c.counted {
		if k.permits == 1 && k.mode != "read" {
			written[scope{k.prefix, k.shape}] = true
		}
	}
	reported := make(map[scope]bool)
	for _, k := range c.counted {
		sc := scope{k.prefix, k.shape}
		if k.mode != "read" || written[sc] || reported[sc] {
			continue
		}
		reported[sc] = true
		c.warnAt(k.s, k.s.ruleNode(k.rule, "Mode", "Key"), "%s takes read locks of %s, and no rule checked here writes under it (Mode: write, "+
			"or a lock without Mode): a read lock excludes writes only, so on its own it holds no request back; note that the writes "+
			"of %s must lock the same key, here or in the service that makes them (give its config to check too)",
			k.s.field(fmt.Sprintf("Lock.Rules[%d]", k.rule)), k.shape, k.shape)
	}
}

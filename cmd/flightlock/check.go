package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3" // keeps the line of every node, for file:line messages

	"github.com/flightlock/flightlock/middleware"
)

// flightlock check reads a service's config as go-zero and middleware.New read it,
// and its API definition with goctl's own parser (.api) and a protobuf parser (.proto), and
// reports, one line each as file:line: message, the lock mistakes that otherwise ship
// silently: a rule that matches no route, a key field the request does not bind, a Lock
// section on the embedded store, a setting go-zero ignores or refuses.

const checkUsage = `usage: flightlock check [-q] -f etc/service.yaml [-api service.api]... [-proto service.proto]...

Checks the Lock sections of the config files against go-zero's loader, flightlock's own
validation and the service's API definition, without connecting to a store. Prints one finding
per line (file:line: message; warnings as file:line: warning: message), then one line per
config file saying what it checked (file: 3 rules checked, 2 routes matched, 0 warnings; left
out with -q), and exits with status 1 when any finding is an error.

`

// finding is one line of check's report.
type finding struct {
	file    string
	line    int
	warning bool
	msg     string
}

func (f finding) String() string {
	if f.warning {
		return fmt.Sprintf("%s:%d: warning: %s", f.file, f.line, f.msg)
	}
	return fmt.Sprintf("%s:%d: %s", f.file, f.line, f.msg)
}

// listFlag is a flag that may be given several times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// runCheck is flightlock check: it returns the exit code.
func runCheck(args []string, stdout, stderr io.Writer) int {
	var files, apis, protos listFlag
	fs := flag.NewFlagSet("flightlock check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quiet := fs.Bool("q", false, "print the findings only, without the line per file that says what was checked (for scripts)")
	fs.Var(&files, "f", "the service's config `file` (YAML or JSON); may be repeated")
	fs.Var(&apis, "api", "the REST service's goctl .api `file`, to check REST rules against; may be repeated")
	fs.Var(&protos, "proto", "the zrpc service's .proto `file`, to check RPC rules against; may be repeated")
	fs.Usage = func() {
		fmt.Fprint(stderr, checkUsage)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	switch {
	case len(pos) > 0:
		fmt.Fprintf(stderr, "flightlock: check takes no arguments, got %q: name the config with -f\n", pos)
		fs.Usage()
		return exitUsage
	case len(files) == 0:
		fmt.Fprintln(stderr, "flightlock: check needs the service's config: -f etc/service.yaml")
		fs.Usage()
		return exitUsage
	}

	c := &checker{}
	for _, a := range apis {
		if err := c.loadAPI(a); err != nil {
			fmt.Fprintf(stderr, "flightlock: %v\n", err)
			return exitError
		}
	}
	for _, p := range protos {
		if err := c.loadProto(p); err != nil {
			fmt.Fprintf(stderr, "flightlock: %v\n", err)
			return exitError
		}
	}
	for _, f := range files {
		if err := c.checkFile(f); err != nil {
			fmt.Fprintf(stderr, "flightlock: %v\n", err)
			return exitError
		}
	}
	c.checkKeyScopes()
	c.checkPermitCounts()
	c.checkFairness()
	c.checkReadsWritten()
	slices.SortStableFunc(c.findings, func(a, b finding) int { return cmp.Compare(a.line, b.line) })
	code := exitOK
	for _, f := range c.files {
		errs, warns := 0, 0
		for _, fd := range c.findings {
			if fd.file != f {
				continue
			}
			fmt.Fprintln(stdout, fd)
			if fd.warning {
				warns++
			} else {
				errs++
				code = exitError
			}
		}
		if !*quiet {
			fmt.Fprintln(stdout, c.summary(f, errs, warns))
		}
	}
	return code
}

// fileStats is what check looked at in one config file, for its summary line.
type fileStats struct {
	sections int
	rules    int
	routes   map[string]bool // "POST /api/x" of the .api files that a rule matched
	methods  map[string]bool // full names of the .proto methods that a rule matched
}

// stats returns the statistics of file, created on first use.
func (c *checker) stats(file string) *fileStats {
	if c.byFile == nil {
		c.byFile = make(map[string]*fileStats)
	}
	st := c.byFile[file]
	if st == nil {
		st = &fileStats{routes: make(map[string]bool), methods: make(map[string]bool)}
		c.byFile[file] = st
	}
	return st
}

// summary is the line that says what check did with file: "etc/bank.yaml: 3 rules checked,
// 2 routes and 1 method matched, 0 warnings". Routes are counted when -api is given, methods
// when -proto is; a file whose rules were not compared with any API definition says so.
func (c *checker) summary(file string, errs, warns int) string {
	st := c.stats(file)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", file, count(st.rules, "rule"))
	if st.sections > 1 {
		fmt.Fprintf(&b, " in %d Lock sections", st.sections)
	}
	b.WriteString(" checked, ")
	var matched []string
	if c.apiFiles != nil {
		matched = append(matched, count(len(st.routes), "route"))
	}
	if c.protos != nil {
		matched = append(matched, count(len(st.methods), "method"))
	}
	if matched == nil {
		b.WriteString("no routes or methods (no -api or -proto), ")
	} else {
		b.WriteString(strings.Join(matched, " and ") + " matched, ")
	}
	if errs > 0 {
		b.WriteString(count(errs, "error") + ", ")
	}
	b.WriteString(count(warns, "warning"))
	return b.String()
}

// count is "1 rule", "2 rules".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// checker holds the API definitions and collects the findings.
type checker struct {
	routes   []route    // of every -api file
	apiFiles []string   // their base names, for messages
	groups   []apiGroup // @server blocks of every -api file
	rpcs     []rpcMethod
	messages map[string]*protoMessage // by full name: "inventory.DebitRequest"
	protos   []string                 // base names of the -proto files
	findings []finding
	files    []string              // the config files, in the order given, each once
	byFile   map[string]*fileStats // by config file, for the summary lines
	keyed    []keyedRule           // every loaded rule's keys, compared across rules at the end
	counted  []countedKey          // every loaded rule's keys with its permit count, likewise
}

// section is one Lock mapping of a config file.
type section struct {
	file   string
	path   string     // "Order.Lock", for messages; fields are named from it
	key    *yaml.Node // the Lock key, for its line
	value  *yaml.Node // the mapping under it
	parent *yaml.Node // the mapping that holds it, whose Mode and Timeout are the service's
	conf   middleware.LockConf
	loaded bool // conf holds what go-zero loads
}

func (c *checker) add(file string, line int, warning bool, format string, args ...any) {
	c.findings = append(c.findings, finding{file: file, line: line, warning: warning, msg: fmt.Sprintf(format, args...)})
}

// errorAt and warnAt add a finding at the line of node n of section s.
func (c *checker) errorAt(s *section, n *yaml.Node, format string, args ...any) {
	c.add(s.file, n.Line, false, format, args...)
}

func (c *checker) warnAt(s *section, n *yaml.Node, format string, args ...any) {
	c.add(s.file, n.Line, true, format, args...)
}

// checkFile checks every Lock section of one config file.
func (c *checker) checkFile(file string) error {
	if slices.Contains(c.files, file) {
		return nil // named twice with -f: once is enough
	}
	content, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	c.files = append(c.files, file)
	c.stats(file)
	// ${VAR} expanded as go-zero's conf.UseEnv does; a file without variables reads the same.
	content = []byte(os.ExpandEnv(string(content)))
	var doc yaml.Node
	if err := yaml.Unmarshal(content, &doc); err != nil {
		// A file go-zero cannot read either: one finding at the line yaml.v3 names
		// ("yaml: line 5: ..."), so that editors and CI point at it like any other.
		line, msg := 1, strings.TrimPrefix(err.Error(), "yaml: ")
		if m := yamlErrorLine.FindStringSubmatch(msg); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = m[2]
		}
		c.add(file, line, false, "not valid YAML, go-zero's loader refuses the file: %s", msg)
		return nil
	}
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = deref(doc.Content[0])
	}
	var sections []*section
	findSections(file, root, "", &sections)
	if len(sections) == 0 {
		c.add(file, 1, false, "no Lock section: nothing is locked; add Lock: (middleware.LockConf) to the service's config and pass it to middleware.New")
		return nil
	}
	topRedis := root != nil && root.Kind == yaml.MappingNode && lookup(root, "Redis") != nil
	for _, s := range sections {
		c.checkSection(s, topRedis)
	}
	return nil
}

// yamlErrorLine splits yaml.v3's "line N: message".
var yamlErrorLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// findSections collects the mappings under a key Lock (in any case, as go-zero matches keys)
// at any depth of mappings, without looking inside them.
func findSections(file string, n *yaml.Node, path string, out *[]*section) {
	if n == nil || n.Kind != yaml.MappingNode {
		return
	}
	for _, p := range pairs(n) {
		kp := p.key.Value
		if path != "" {
			kp = path + "." + kp
		}
		v := deref(p.value)
		if strings.EqualFold(p.key.Value, "lock") && v.Kind == yaml.MappingNode {
			*out = append(*out, &section{file: file, path: kp, key: p.key, value: v, parent: n})
			continue
		}
		findSections(file, v, kp, out)
	}
}

// checkSection runs every check on one Lock section.
func (c *checker) checkSection(s *section, topRedis bool) {
	drop := c.walkSettings(s, s.value, lockConfType, s.path)
	c.load(s, drop)
	st := c.stats(s.file)
	st.sections++
	if !s.loaded {
		return
	}
	st.rules += len(s.conf.Rules)
	c.checkStore(s, topRedis)
	c.checkWaits(s)
	c.checkMaxHold(s)
	c.checkOwnerTrust(s)
	for i, r := range s.conf.Rules {
		c.checkRule(s, i, r)
		c.checkKeyParts(s, i, r)
	}
}

// field names a setting of s for messages: "Lock.Rules[0].Key" in "Order.Lock" is
// "Order.Lock.Rules[0].Key".
func (s *section) field(f string) string {
	if rest, ok := strings.CutPrefix(f, "Lock"); ok {
		return s.path + rest
	}
	return f
}

// node returns the YAML node of a field of s named as middleware names it
// ("Lock.Rules[2].Key"): the key node of a mapping entry or the item of a sequence, or the
// deepest of them that the file has, when the field itself is not written (a default).
func (s *section) node(f string) *yaml.Node {
	best, cur := s.key, s.value
	rest, _ := strings.CutPrefix(f, "Lock")
	for rest != "" {
		switch {
		case rest[0] == '.':
			rest = rest[1:]
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			name := rest[:end]
			rest = rest[end:]
			if cur == nil || cur.Kind != yaml.MappingNode {
				return best
			}
			p := lookup(cur, name)
			if p == nil {
				return best
			}
			best, cur = p.key, deref(p.value)
		case rest[0] == '[':
			end := strings.IndexByte(rest, ']')
			var i int
			if end < 0 || cur == nil || cur.Kind != yaml.SequenceNode {
				return best
			}
			if _, err := fmt.Sscanf(rest[1:end], "%d", &i); err != nil || i < 0 || i >= len(cur.Content) {
				return best
			}
			rest = rest[end+1:]
			best = deref(cur.Content[i])
			cur = best
		default:
			return best
		}
	}
	return best
}

// ruleNode returns the node of the first of the rule's settings that the file writes, or the
// rule itself.
func (s *section) ruleNode(i int, settings ...string) *yaml.Node {
	item := s.node(fmt.Sprintf("Lock.Rules[%d]", i))
	for _, set := range settings {
		if n := s.node(fmt.Sprintf("Lock.Rules[%d].%s", i, set)); n != item {
			return n
		}
	}
	return item
}

// pair is one entry of a YAML mapping.
type pair struct{ key, value *yaml.Node }

// pairs returns the entries of mapping n, with those of YAML merge keys (<<: *base) that n
// does not set itself, as yaml.v2 (go-zero's parser) merges them.
func pairs(n *yaml.Node) []pair {
	var own, merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" || k.Value == "<<" && k.Style == 0 {
			for _, m := range mergeSources(v) {
				merged = append(merged, pairs(m)...)
			}
			continue
		}
		own = append(own, pair{k, v})
	}
	for _, p := range merged {
		if !slices.ContainsFunc(own, func(o pair) bool { return strings.EqualFold(o.key.Value, p.key.Value) }) {
			own = append(own, p)
		}
	}
	return own
}

func mergeSources(v *yaml.Node) []*yaml.Node {
	v = deref(v)
	switch v.Kind {
	case yaml.MappingNode:
		return []*yaml.Node{v}
	case yaml.SequenceNode:
		var out []*yaml.Node
		for _, x := range v.Content {
			if x = deref(x); x.Kind == yaml.MappingNode {
				out = append(out, x)
			}
		}
		return out
	}
	return nil
}

// lookup returns the entry of mapping n whose key is name in any case (the last one, if the
// file writes it twice), or nil.
func lookup(n *yaml.Node, name string) *pair {
	var found *pair
	for _, p := range pairs(n) {
		if strings.EqualFold(p.key.Value, name) {
			found = &p
		}
	}
	return found
}

// deref follows YAML aliases (*name) to the node they name.
func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

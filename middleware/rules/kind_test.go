package rules

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/core/conf"
)

// Each combination of Mode and Fair that the core refuses is refused at Validate, naming the
// field to change and saying what to do instead; the combinations it takes pass.
func TestLockKindRefusesWhatTheCoreCannotKeep(t *testing.T) {
	get := Rule{Method: http.MethodGet, Path: "/api/order/:id", Key: "order:{path.id}"}
	tests := []validationCase{ // message: a part of the fix
		{"read", func(r *Rule, _ *LockConf) { r.Mode = "read" }, "", ""},
		{"write in any case", func(r *Rule, _ *LockConf) { r.Mode = "WRITE" }, "", ""},
		{"read in any case, reject", func(r *Rule, _ *LockConf) { r.Mode, r.OnBusy = "Read", "reject" }, "", ""},
		{"fair", func(r *Rule, _ *LockConf) { r.Fair = true }, "", ""},
		{"fair write", func(r *Rule, _ *LockConf) { r.Mode, r.Fair = "write", true }, "", ""},
		{"read in shadow", func(r *Rule, _ *LockConf) { r.Mode, r.Shadow = "read", true }, "", ""},
		{"read failing closed in an open section", func(r *Rule, c *LockConf) {
			r.Mode, r.OnStoreError, c.OnStoreError = "read", "closed", "open"
		}, "", ""},
		{"unknown mode", func(r *Rule, _ *LockConf) { r.Mode = "shared" }, "Lock.Rules[0].Mode", "read, write"},
		{"read with permits", func(r *Rule, _ *LockConf) { r.Mode, r.Permits = "read", 3 }, "Lock.Rules[0].Permits", "drop Permits"},
		{"write with permits", func(r *Rule, _ *LockConf) { r.Mode, r.Permits = "write", 3 }, "Lock.Rules[0].Permits", "drop Permits"},
		{"read and fair", func(r *Rule, _ *LockConf) { r.Mode, r.Fair = "read", true }, "Lock.Rules[0].Fair", "set Fair on the write rules"},
		{"read and share", func(r *Rule, _ *LockConf) { r.Mode, r.OnBusy = "read", "share" }, "Lock.Rules[0].OnBusy", "use wait or reject"},
		{"fair with permits", func(r *Rule, _ *LockConf) { r.Fair, r.Permits = true, 2 }, "Lock.Rules[0].Fair", "drop Fair or Permits"},
		{"read failing open", func(r *Rule, _ *LockConf) { r.Mode, r.OnStoreError = "read", "Open" }, "Lock.Rules[0].OnStoreError", "set closed"},
		{"fair failing open", func(r *Rule, _ *LockConf) { r.Fair, r.OnStoreError = true, "open" }, "Lock.Rules[0].OnStoreError", "a fair lock"},
		{"read in an open section", func(r *Rule, c *LockConf) { r.Mode, c.OnStoreError = "read", "open" },
			"Lock.Rules[0].OnStoreError", "set OnStoreError: closed on the rule"},
		{"shadow read in an open section", func(r *Rule, c *LockConf) { r.Mode, r.Shadow, c.OnStoreError = "read", true, "open" },
			"Lock.Rules[0].OnStoreError", "Lock.OnStoreError: open"},
		// Rules that cannot mean what they say.
		{"read on PUT", func(r *Rule, _ *LockConf) { r.Method, r.Mode = http.MethodPut, "read" }, "Lock.Rules[0].Mode", "use Mode write"},
		{"read on POST", func(r *Rule, _ *LockConf) { r.Method, r.Mode = "post", "read" }, "Lock.Rules[0].Mode", "ReadOnly: true"},
		{"read on a POST that only reads", func(r *Rule, _ *LockConf) { r.Method, r.Mode, r.ReadOnly = http.MethodPost, "read", true }, "", ""},
		{"read on HEAD", func(r *Rule, _ *LockConf) { r.Method, r.Mode = http.MethodHead, "read" }, "", ""},
		{"read on any method of a named rule", func(r *Rule, _ *LockConf) { r.Method, r.Path, r.Name, r.Mode = "", "", "Orders", "read" }, "", ""},
		{"ReadOnly without Mode read", func(r *Rule, _ *LockConf) { r.Method, r.ReadOnly = http.MethodPost, true }, "Lock.Rules[0].ReadOnly", "Mode read"},
		{"one permit", func(r *Rule, _ *LockConf) { r.Permits = 1 }, "Lock.Rules[0].Permits", "leave Permits out for a lock"},
		{"no permits", func(r *Rule, _ *LockConf) { r.Permits = 0 }, "", ""},
		{"permits above the bound", func(r *Rule, _ *LockConf) { r.Permits = flightlock.MaxPermits + 1 }, "Lock.Rules[0].Permits", "must be 2 to"},
	}
	checkValidation(t, get, tests)
}

// validationCase is a rule (or its section) edited from a base, and what Validate must say of it.
type validationCase struct {
	name    string
	edit    func(r *Rule, c *LockConf)
	field   string // "" means valid
	message string // a part of the message
}

// checkValidation validates a section of one rule, base edited by each case: valid, or a
// ConfigError (an ErrConfig) of the case's field whose message says the case's message.
func checkValidation(t *testing.T, base Rule, tests []validationCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := base
			c := LockConf{}
			tt.edit(&r, &c)
			c.Rules = []Rule{r}
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field || !errors.Is(err, flightlock.ErrConfig) {
				t.Fatalf("Validate: %v, want a ConfigError of %s", err, tt.field)
			}
			if !strings.Contains(err.Error(), tt.message) {
				t.Errorf("Validate: %v, want it to say %q", err, tt.message)
			}
		})
	}
}

// Mode and Fair load from YAML in any case, and their rule's options are the core's read and
// fair options: a write rule takes the same options as a plain one. (The plain rule locks
// another key: rules on one key agree on Fair.)
func TestModeAndFairLoadFromYAML(t *testing.T) {
	var c struct{ Lock LockConf }
	err := conf.LoadFromYamlBytes([]byte(`
Lock:
  Rules:
    - { Method: GET, Path: /api/order/:id, Key: "order:{path.id}", Mode: Read }
    - { Method: POST, Path: /api/order/:id, Key: "order:{path.id}", Mode: write, Fair: true }
    - { Method: DELETE, Path: /api/orders, Key: "orders" }
`), &c)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Lock.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	n := c.Lock.Normalized()
	read, write, plain := n.Rules[0], n.Rules[1], n.Rules[2]
	if read.Mode != ModeRead || read.LockMode() != "read" || write.LockMode() != "write" || plain.LockMode() != "write" {
		t.Errorf("modes %q %q %q, want read, write and write (a plain lock)", read.LockMode(), write.LockMode(), plain.LockMode())
	}
	if !write.Fair || read.Fair || plain.Fair {
		t.Errorf("Fair %v %v %v, want only the write rule's", read.Fair, write.Fair, plain.Fair)
	}
	if got := len(read.LockOptions()); got != 1 {
		t.Errorf("the read rule has %d options, want WithRead alone", got)
	}
	if got := len(write.LockOptions()); got != 1 {
		t.Errorf("the fair write rule has %d options, want WithFair alone (a write is a plain lock)", got)
	}
	if got := len(plain.LockOptions()); got != 0 {
		t.Errorf("the plain rule has %d options, want none", got)
	}
}

// Rules of one section that lock one key in ways that cannot exclude each other are refused at
// start-up, naming the later rule's field and the earlier rule: different Permits on one key
// shape, Fair on one rule and not another, a read rule and a write rule of one route keyed
// apart. Rules that agree, and rules on other keys, pass.
func TestRulesThatCannotExcludeEachOtherAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []Rule
		field string // "" when the set is fine
		say   string
	}{
		{"semaphore beside a lock", []Rule{
			{Method: "POST", Path: "/export/:t", Key: "export:{path.t}", Permits: 3},
			{Method: "DELETE", Path: "/export/:t", Key: "export:{path.t}"},
		}, "Lock.Rules[1].Permits", "Lock.Rules[0]"},
		{"two counts", []Rule{
			{Method: "POST", Path: "/export/:t", Key: "export:{path.t}", Permits: 3},
			{Method: "PUT", Path: "/export/:t", Key: "export:{path.t}", Permits: 4},
		}, "Lock.Rules[1].Permits", "Permits: 3"},
		{"semaphore beside a read rule", []Rule{
			{Method: "GET", Path: "/price/:sku", Key: "price:{path.sku}", Mode: "read"},
			{Method: "POST", Path: "/price/:sku/batch", Key: "price:{path.sku}", Permits: 2},
		}, "Lock.Rules[1].Permits", "Mode: read (no Permits)"},
		{"fair and unfair", []Rule{
			{Method: "POST", Path: "/ticket/:desk", Key: "desk:{path.desk}", Fair: true},
			{Method: "PUT", Path: "/ticket/:desk", Key: "desk:{path.desk}"},
		}, "Lock.Rules[1].Fair", "make every rule on a key fair"},
		{"read and write keyed apart", []Rule{
			{Method: "GET", Path: "/price/:sku", Key: "price:{path.sku}", Mode: "read"},
			{Method: "PUT", Path: "/price/:id", Key: "prices:{path.id}", Mode: "write"},
		}, "Lock.Rules[1].Key", "never exclude each other"},
		{"read and a plain lock keyed apart", []Rule{
			{Method: "PUT", Path: "/price/:sku", Key: "p:{path.sku}"},
			{Method: "GET", Path: "/price/:sku", Key: "price:{path.sku}", Mode: "read"},
		}, "Lock.Rules[1].Key", "same route /price/:sku"},
		{"read and write of one key", []Rule{
			{Method: "GET", Path: "/price/:sku", Key: "price:{path.sku}", Mode: "read"},
			{Method: "PUT", Path: "/price/:id", Key: "price:{path.id}", Mode: "write"},
			{Method: "POST", Path: "/export/:t", Key: "export:{path.t}", Permits: 3},
			{Method: "POST", Path: "/ticket/:d", Key: "desk:{path.d}", Fair: true},
			{Method: "PUT", Path: "/ticket/:d", Key: "desk:{path.d}", Fair: true},
		}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := LockConf{Rules: tc.rules}
			err := c.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.say) {
				t.Fatalf("Validate: %v, want a ConfigError of %s saying %q", err, tc.field, tc.say)
			}
		})
	}
}

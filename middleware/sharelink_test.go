package middleware

import (
	"errors"
	"strings"
	"testing"

	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
	_ "github.com/flightlock/flightlock/middleware/share" // response sharing, as a binary with share rules links it
)

// A share rule in a binary without response sharing is refused at start-up, naming the rule's
// OnBusy and the import that links it, whether it comes from the config or from Route; with
// the import, it runs.
func TestShareRuleWithoutSharePackageNamesTheImport(t *testing.T) {
	tr := newTestRedis(t)
	conf := LockConf{Rules: []Rule{shareRule()}}
	newSharing := sharehook.New
	sharehook.New = nil
	_, err := New(conf, WithLocker(tr.locker(t)))
	plain, perr := New(LockConf{}, WithLocker(tr.locker(t)))
	sharehook.New = newSharing
	var ce *rules.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Lock.Rules[0].OnBusy" || !strings.Contains(err.Error(), shareImport) {
		t.Fatalf("New with a share rule, without response sharing linked: %v; want a ConfigError naming "+
			"Lock.Rules[0].OnBusy and %s", err, shareImport)
	}
	if perr != nil {
		t.Fatalf("New without share rules, without response sharing linked: %v", perr)
	}
	defer plain.Close()
	_, err = plain.Route(Rule{Method: "POST", Path: "/pay", Key: "pay:{header.X-Uid}", OnBusy: "share"})
	if !errors.As(err, &ce) || ce.Field != "Rule.OnBusy" || !strings.Contains(err.Error(), shareImport) {
		t.Fatalf("Route with OnBusy share, without response sharing linked: %v; want a ConfigError naming "+
			"Rule.OnBusy and %s", err, shareImport)
	}
	m, err := New(conf, WithLocker(tr.locker(t)))
	if err != nil {
		t.Fatalf("New with a share rule, response sharing linked: %v", err)
	}
	_ = m.Close()
}

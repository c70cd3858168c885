package middleware

import (
	"errors"
	"strings"
	"testing"

	"github.com/flightlock/flightlock/middleware/rules"
)

// A share rule in a binary without response sharing is refused at start-up, naming the rule's
// OnBusy and the line that sets ResponseSharing, whether it comes from the config or from
// Route; with it set, it runs.
func TestShareRuleWithoutResponseSharingNamesTheLineThatSetsIt(t *testing.T) {
	tr := newTestRedis(t)
	conf := LockConf{Rules: []Rule{shareRule()}}
	newSharing := ResponseSharing
	ResponseSharing = nil
	_, err := New(conf, WithLocker(tr.locker(t)))
	plain, perr := New(LockConf{}, WithLocker(tr.locker(t)))
	ResponseSharing = newSharing
	var ce *rules.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Lock.Rules[0].OnBusy" || !strings.Contains(err.Error(), responseSharingLine) {
		t.Fatalf("New with a share rule, without response sharing linked: %v; want a ConfigError naming "+
			"Lock.Rules[0].OnBusy and %s", err, responseSharingLine)
	}
	if perr != nil {
		t.Fatalf("New without share rules, without response sharing linked: %v", perr)
	}
	defer plain.Close()
	_, err = plain.Route(Rule{Method: "POST", Path: "/pay", Key: "pay:{header.X-Uid}", OnBusy: "share"})
	if !errors.As(err, &ce) || ce.Field != "Rule.OnBusy" || !strings.Contains(err.Error(), responseSharingLine) {
		t.Fatalf("Route with OnBusy share, without response sharing linked: %v; want a ConfigError naming "+
			"Rule.OnBusy and %s", err, responseSharingLine)
	}
	m, err := New(conf, WithLocker(tr.locker(t)))
	if err != nil {
		t.Fatalf("New with a share rule, response sharing linked: %v", err)
	}
	_ = m.Close()
}

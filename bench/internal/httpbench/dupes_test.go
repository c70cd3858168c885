package httpbench

import (
	"testing"

	flmw "github.com/flightlock/flightlock/middleware"
)

// The duplicates scenario builds its middleware from DupRule for each OnBusy it measures: a
// rule the middleware refuses at start-up would stop the whole run.
func TestDupRuleIsARuleTheMiddlewareAccepts(t *testing.T) {
	for _, onBusy := range []string{"share", "reject"} {
		conf := flmw.LockConf{Rules: []flmw.Rule{DupRule(onBusy)}}
		if err := conf.Validate(); err != nil {
			t.Errorf("DupRule(%q): %v", onBusy, err)
		}
	}
}

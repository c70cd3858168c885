package rules

import (
	"net/http"
	"testing"
	"time"
)

// A setting that the rest of its rule (or section) leaves nothing to act on is refused at
// Validate, naming the field and the setting that ignores it, instead of being dropped; the
// same setting where it counts passes.
func TestSettingsThatCannotBeHonouredAreRefused(t *testing.T) {
	post := Rule{Method: http.MethodPost, Path: "/api/order/:id", Key: "order:{path.id}"}
	tests := []validationCase{ // message: a part of it, the setting that ignores it
		{"Wait on a wait rule", func(r *Rule, _ *LockConf) { r.Wait = 5 * time.Second }, "", ""},
		{"Wait on a share rule", func(r *Rule, _ *LockConf) { r.OnBusy, r.Wait = "share", 5*time.Second }, "", ""},
		{"Wait on a shadow rule that will wait", func(r *Rule, _ *LockConf) { r.Shadow, r.Wait = true, 5*time.Second }, "", ""},
		{"Wait on a reject rule", func(r *Rule, _ *LockConf) { r.OnBusy, r.Wait = "Reject", 5*time.Second }, "Lock.Rules[0].Wait", "OnBusy reject"},
		{"Wait on a shadow reject rule", func(r *Rule, _ *LockConf) { r.OnBusy, r.Shadow, r.Wait = "reject", true, time.Second },
			"Lock.Rules[0].Wait", "OnBusy reject"},
		{"Replay on a share rule", func(r *Rule, _ *LockConf) { r.OnBusy, r.Replay = "share", time.Minute }, "", ""},
		{"the replay defaults on a wait rule", func(r *Rule, _ *LockConf) {
			r.Replay, r.ReplayStatus, r.ReplayMaxBytes = 10*time.Second, "2xx", 65536
		}, "", ""},
		{"Replay on a wait rule", func(r *Rule, _ *LockConf) { r.Replay = time.Minute }, "Lock.Rules[0].Replay", "OnBusy share"},
		{"ReplayStatus on a reject rule", func(r *Rule, _ *LockConf) { r.OnBusy, r.ReplayStatus = "reject", "2xx,4xx" },
			"Lock.Rules[0].ReplayStatus", "OnBusy share"},
		{"ReplayMaxBytes on a wait rule", func(r *Rule, _ *LockConf) { r.ReplayMaxBytes = 1 << 20 }, "Lock.Rules[0].ReplayMaxBytes", "OnBusy share"},
		{"Retry pacing of a linear backoff", func(_ *Rule, c *LockConf) {
			c.Retry = RetryConf{Backoff: "linear", Min: time.Millisecond, Max: time.Second, Attempts: 3}
		}, "", ""},
		{"Backoff none at its defaults", func(_ *Rule, c *LockConf) { c.Retry = RetryConf{Backoff: "None"} }, "", ""},
		{"one attempt with Backoff none", func(_ *Rule, c *LockConf) { c.Retry = RetryConf{Backoff: "none", Attempts: 1} }, "", ""},
		{"Attempts with Backoff none", func(_ *Rule, c *LockConf) { c.Retry = RetryConf{Backoff: "none", Attempts: 5} },
			"Lock.Retry.Attempts", "Backoff none"},
		{"Min with Backoff none", func(_ *Rule, c *LockConf) { c.Retry = RetryConf{Backoff: "none", Min: 50 * time.Millisecond} },
			"Lock.Retry.Min", "Backoff none"},
		{"Max with Backoff none", func(_ *Rule, c *LockConf) { c.Retry = RetryConf{Backoff: "none", Max: time.Second} },
			"Lock.Retry.Max", "Backoff none"},
	}
	checkValidation(t, post, tests)
}

package middleware

import (
	"strings"
	"testing"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/logx/logtest"
)

// TrustOwner without OwnerSecret honours any owner a caller names in the metadata: a client
// that can reach the service and has learned a holder's owner token (from a log, from
// `flightlock ls`) re-enters that lock beside its holder. It is allowed (a closed network may
// be trust enough), but New says so at error level, once, naming both settings; with a secret,
// or without TrustOwner, it says nothing.
func TestTrustOwnerWithoutSecretIsLogged(t *testing.T) {
	logx.SetLevel(logx.InfoLevel) // TestMain disabled the logs
	t.Cleanup(logx.Disable)
	rules := []Rule{{RPC: "/bal.Balance/Debit", Key: "acct:{account}"}}
	for _, tc := range []struct {
		name string
		c    LockConf
		want bool
	}{
		{"trust, no secret", LockConf{TrustOwner: true, Rules: rules}, true},
		{"trust and secret", LockConf{TrustOwner: true, OwnerSecret: "s", Rules: rules}, false},
		{"no trust", LockConf{Rules: rules}, false},
	} {
		logs := logtest.NewCollector(t)
		m, err := New(tc.c, WithServiceMode("test"))
		if err != nil {
			t.Fatalf("%s: New: %v", tc.name, err)
		}
		_ = m.Close()
		var got []string
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "Lock.TrustOwner") {
				got = append(got, line)
			}
		}
		switch {
		case !tc.want && len(got) > 0:
			t.Errorf("%s: logged %q", tc.name, got)
		case tc.want && len(got) != 1:
			t.Errorf("%s: %d lines %q, want one", tc.name, len(got), got)
		case tc.want && (!strings.Contains(got[0], `"level":"error"`) || !strings.Contains(got[0], "Lock.OwnerSecret")):
			t.Errorf("%s: logged %q, want an error naming Lock.OwnerSecret", tc.name, got[0])
		}
	}
}

package middleware

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/logx/logtest"
)

// A waiting rule whose Wait is not below the server's Timeout (go-zero's RestConf.Timeout or
// RpcServerConf.Timeout, in ms) is logged once at start-up with the rule's name:
// such a wait always runs to the end of the request's time, so the caller has none left to
// retry. Rules below the timeout, reject rules and a disabled timeout (0) are not logged.
func TestWaitNotBelowServerTimeoutIsLogged(t *testing.T) {
	logx.SetLevel(logx.InfoLevel) // TestMain disabled the logs
	t.Cleanup(logx.Disable)
	rules := []Rule{
		{Method: http.MethodPost, Path: "/a/:x", Key: "a:{x}"},                               // Lock.Wait 2s
		{Method: http.MethodPost, Path: "/b/:x", Key: "b:{x}", Wait: 500 * time.Millisecond}, // below
		{Method: http.MethodPost, Path: "/c/:x", Key: "c:{x}", OnBusy: "reject"},             // no wait
		{RPC: "/inv.Inv/Reserve", Key: "sku:{sku}", Wait: 3 * time.Second, OnBusy: "share"},
		{Method: http.MethodPost, Path: "/d/:x", Key: "d:{x}", Wait: 3 * time.Second, Shadow: true}, // never waits
	}
	for _, tc := range []struct {
		timeout int64
		want    []string
	}{
		{2000, []string{"Lock.Rules[0]: Wait 2s is not below the server's Timeout 2s", "Lock.Rules[3]: Wait 3s is not below the server's Timeout 2s"}},
		{3000, []string{"Lock.Rules[3]: Wait 3s is not below the server's Timeout 3s"}},
		{5000, nil},
		{0, nil}, // go-zero's timeout handler is off
	} {
		logs := logtest.NewCollector(t)
		m, err := New(LockConf{Rules: rules}, WithServiceMode("test"), WithServerTimeout(tc.timeout))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		_ = m.Close()
		var got []string
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "not below the server's Timeout") {
				if !strings.Contains(line, `"level":"error"`) {
					t.Errorf("timeout %d: logged as %q, want level error", tc.timeout, line)
				}
				got = append(got, line)
			}
		}
		if len(got) != len(tc.want) {
			t.Errorf("timeout %d: %d lines %q, want %d", tc.timeout, len(got), got, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("timeout %d: line %d = %q, want it to say %q", tc.timeout, i, got[i], w)
			}
		}
	}
	if _, err := New(LockConf{}, WithServiceMode("test"), WithServerTimeout(-1)); err == nil {
		t.Error("WithServerTimeout(-1): no error")
	}
}

package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/check/*.golden with flightlock check's output")

const checkDir = "testdata/check"

// TestCheckGolden runs flightlock check over the fixture services (wallet.api, inventory.proto;
// bank.api, bank.proto) and one YAML file per mistake, and compares its output and exit status
// with the golden file. Each mistake file must give exactly one finding, the clean ones none, so that a
// check that goes missing fails here even after -update.
func TestCheckGolden(t *testing.T) {
	api := []string{"-api", checkDir + "/wallet.api"}
	proto := []string{"-proto", checkDir + "/inventory.proto"}
	bankAPI := []string{"-api", checkDir + "/bank.api"}
	bankProto := []string{"-proto", checkDir + "/bank.proto"}
	tests := []struct {
		name  string
		flags []string
		want  string // "error", "warning" or "" for no finding
	}{
		{"clean", api, ""},
		{"methodcase", api, ""}, // Method: post, as the .api file writes it
		{"prefix", api, "error"},
		{"userid", api, "error"},
		{"formfield", api, "error"},
		{"nolock", api, "error"},
		{"noredis", api, "error"},
		{"onbusy", api, "error"},
		{"onbussy", api, "error"},
		{"ttl", api, "error"},
		{"pass", api, "error"},
		{"twice", api, "error"},
		{"middleware", api, "error"},
		{"getroute", api, "error"},
		{"badyaml", api, "error"}, // a file go-zero cannot read: the YAML error at its line
		{"float32key", api, "error"},
		{"float32nested", api, "error"},
		{"float64key", api, "warning"},
		{"rpcclean", proto, ""},
		{"rpccase", proto, "error"},
		{"rpcnopkg", proto, "error"},
		{"rpcmissing", proto, "error"},
		{"restinrpc", proto, "error"},
		{"accountid", proto, "error"},
		{"waittimeout", proto, "warning"},
		{"trustowner", proto, "warning"},
		{"mixedkeys", api, "warning"},
		{"keyshape", api, "warning"},
		{"permits", api, "error"},
		{"readwrite", api, ""},
		{"fairmixed", api, "error"},
		{"permitsmode", api, "error"},
		{"readonly", api, "warning"},
		{"readopen", api, "error"},
		{"maxhold", api, "warning"},
		{"waitshare", api, "warning"},
		{"onesided", bankAPI, "warning"},
		{"rpconesided", bankProto, "warning"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"check", "-f", filepath.Join(checkDir, tt.name+".yaml")}, tt.flags...)
			code, out, errOut := cli(t, nil, args...)
			if errOut != "" {
				t.Fatalf("stderr: %s", errOut)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			summary := lines[len(lines)-1]
			lines = lines[:len(lines)-1]
			if !strings.HasPrefix(summary, filepath.Join(checkDir, tt.name+".yaml")+": ") || !strings.Contains(summary, " checked, ") {
				t.Fatalf("output:\n%s\nwant it to end with the file's summary line", out)
			}
			switch {
			case tt.want == "" && (code != exitOK || len(lines) != 0):
				t.Fatalf("exit %d, output:\n%s\nwant no finding", code, out)
			case tt.want == "error" && (code != exitError || len(lines) != 1 || strings.Contains(out, ": warning: ")):
				t.Fatalf("exit %d, output:\n%s\nwant one error", code, out)
			case tt.want == "warning" && (code != exitOK || len(lines) != 1 || !strings.Contains(out, ": warning: ")):
				t.Fatalf("exit %d, output:\n%s\nwant one warning", code, out)
			}
			got := fmt.Sprintf("%sexit status %d\n", out, code)
			golden := filepath.Join(checkDir, tt.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run TestCheckGolden -update to write it)", err)
			}
			if got != string(want) {
				t.Fatalf("flightlock %s:\n%s\nwant (%s):\n%s", strings.Join(args, " "), got, golden, want)
			}
		})
	}
}

// TestCheckExample keeps the example's configuration and its API definitions in step: every
// file of etc/ checks clean against example/order/order.api and the example's protos, but for
// the warnings of the embedded store in dev mode.
func TestCheckExample(t *testing.T) {
	files, err := filepath.Glob("../../etc/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no etc/*.yaml: %v", err)
	}
	for _, f := range files {
		code, out, errOut := cli(t, nil, "check", "-f", f, "-api", "../../example/order/order.api",
			"-proto", "../../example/proto/inventory.proto", "-proto", "../../example/proto/balance.proto")
		if code != exitOK || errOut != "" {
			t.Errorf("check %s: exit %d\n%s%s", f, code, out, errOut)
		}
		for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			if line != "" && !strings.Contains(line, ": warning: ") && !strings.HasPrefix(line, f+": ") {
				t.Errorf("check %s: %s", f, line)
			}
		}
	}
}

// writeConfig writes a config file for one test and returns its path.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "svc.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheckListsEveryProblem: Validate stops at the first bad rule, check lists them all, each
// at its own line, sorted.
func TestCheckListsEveryProblem(t *testing.T) {
	path := writeConfig(t, `Mode: dev
Lock:
  Redis: {Host: 127.0.0.1:6379}
  Rules:
    - Path: /a
      Key: "a:{uid}"
      OnBusy: queue
    - Path: /b
      Key: "b:{uid"
    - Path: /c
      Key: "a:{uid}"
      Retry: 3
`)
	code, out, _ := cli(t, nil, "check", "-q", "-f", path)
	want := []string{
		path + `:7: Lock.Rules[0].OnBusy: must be one of reject, wait, share; got "queue"`,
		path + `:9: Lock.Rules[1].Key: has an unclosed '{' at offset 2`,
		path + `:12: Lock.Rules[2]: unknown setting "Retry": go-zero ignores it`,
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitError || len(lines) != len(want) {
		t.Fatalf("exit %d, output:\n%s\nwant %d errors", code, out, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %s\nwant it to start with %s", i, lines[i], w)
		}
	}
}

// TestCheckExpandsEnv: ${VAR} is expanded as go-zero's conf.UseEnv does, before the checks.
func TestCheckExpandsEnv(t *testing.T) {
	path := writeConfig(t, `Mode: pro
Lock:
  Redis: {Host: "${FLIGHTLOCK_CHECK_TEST_REDIS}"}
  Rules: [{Method: POST, Path: /a, Key: "a:{uid}", OnBusy: reject}]
`)
	t.Setenv("FLIGHTLOCK_CHECK_TEST_REDIS", "")
	if code, out, _ := cli(t, nil, "check", "-q", "-f", path); code != exitError || !strings.Contains(out, ":3: Lock names no store") {
		t.Fatalf("variable unset: exit %d, output:\n%s\nwant the embedded store refused", code, out)
	}
	t.Setenv("FLIGHTLOCK_CHECK_TEST_REDIS", "redis.internal:6379")
	if code, out, _ := cli(t, nil, "check", "-q", "-f", path); code != exitOK || out != "" {
		t.Fatalf("variable set: exit %d, output:\n%s\nwant no finding", code, out)
	}
}

// TestCheckSections: every Lock mapping at any depth is checked and named by its path, with
// its own Mode; keys match in any case, as go-zero matches them.
func TestCheckSections(t *testing.T) {
	path := writeConfig(t, `Redis: {Host: 127.0.0.1:6379}
Api:
  Mode: test
  lock:
    rules: [{method: post, path: /a, key: "a:{uid}", onbusy: reject}]
Rpc:
  Inner:
    Lock:
      Redis: {Host: 127.0.0.1:6379}
      Wait: 1
`)
	code, out, _ := cli(t, nil, "check", "-q", "-f", path)
	want := path + ":4: warning: Api.lock names no store, neither Redis.Host (or Sentinel) nor Etcd.Hosts nor Zookeeper.Hosts (Mode: test)"
	want2 := path + ":10: Rpc.Inner.Lock.Wait: 1 has no unit"
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitError || len(lines) != 2 || !strings.HasPrefix(lines[0], want) || !strings.HasPrefix(lines[1], want2) ||
		!strings.Contains(lines[0], "copy it under Api.lock") {
		t.Fatalf("exit %d, output:\n%s\nwant\n%s...\n%s...", code, out, want, want2)
	}
}

func TestCheckUsage(t *testing.T) {
	for _, args := range [][]string{
		{"check"},
		{"check", "-f", "x.yaml", "extra"},
		{"-f", "x.yaml", "check"},
		{"check", "-f", "x.yaml", "-bogus"},
	} {
		if code, _, errOut := cli(t, nil, args...); code != exitUsage || errOut == "" {
			t.Errorf("flightlock %q: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
	if code, _, errOut := cli(t, nil, "check", "-f", checkDir+"/clean.yaml", "-api", checkDir+"/missing.api"); code != exitError ||
		!strings.Contains(errOut, "missing.api") {
		t.Errorf("a missing .api file: exit %d, stderr %q; want exit 1 naming it", code, errOut)
	}
}

// TestCheckSummarySaysWhatWasChecked: after a file's findings, one line counts its rules, the
// routes and methods they matched in the API files given, and the findings; -q leaves it out,
// so that a script sees the findings only.
func TestCheckSummarySaysWhatWasChecked(t *testing.T) {
	path := writeConfig(t, `Mode: pro
Api:
  Lock:
    Redis: {Host: 127.0.0.1:6379}
    Rules:
      - {Method: POST, Path: /api/wallet/withdraw, Key: "wallet:{form.uid}", OnBusy: reject}
      - {Method: POST, Path: /api/wallet/:from/transfer, Key: "acct:{path.from}+acct:{body.to}", Wait: 1s}
Rpc:
  Lock:
    Redis: {Host: 127.0.0.1:6379}
    Wait: 1s
    Rules:
      - {RPC: /inventory.Inventory/Reserve, Key: "sku:{sku}"}
`)
	flags := []string{"check", "-f", path, "-api", checkDir + "/wallet.api", "-proto", checkDir + "/inventory.proto"}
	code, out, errOut := cli(t, nil, flags...)
	want := path + ": 3 rules in 2 Lock sections checked, 2 routes and 1 method matched, 0 warnings\n"
	if code != exitOK || out != want || errOut != "" {
		t.Fatalf("exit %d, output:\n%s%s\nwant:\n%s", code, out, errOut, want)
	}
	if code, out, _ := cli(t, nil, append(flags[:1:1], append([]string{"-q"}, flags[1:]...)...)...); code != exitOK || out != "" {
		t.Fatalf("-q: exit %d, output:\n%s\nwant none", code, out)
	}
}

// TestCheckSummaryFollowsEachFilesFindings: with several files, each file's findings come
// first, then its summary line, in the order the files are given; -q prints the findings
// alone.
func TestCheckSummaryFollowsEachFilesFindings(t *testing.T) {
	dir := t.TempDir()
	clean := filepath.Join(dir, "clean.yaml")
	warned := filepath.Join(dir, "warned.yaml")
	for file, yaml := range map[string]string{
		clean:  "Mode: pro\nLock:\n  Redis: {Host: 127.0.0.1:6379}\n  Rules: [{Method: POST, Path: /a, Key: \"a:{uid}\", OnBusy: reject}]\n",
		warned: "Mode: dev\nLock:\n  Rules: [{Method: POST, Path: /b, Key: \"b:{sku}\", OnBusy: reject}]\n",
	} {
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code, out, _ := cli(t, nil, "check", "-f", warned, "-f", clean)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != exitOK || len(lines) != 3 ||
		!strings.HasPrefix(lines[0], warned+":2: warning: Lock names no store") ||
		lines[1] != warned+": 1 rule checked, no routes or methods (no -api or -proto), 1 warning" ||
		lines[2] != clean+": 1 rule checked, no routes or methods (no -api or -proto), 0 warnings" {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
	if code, out, _ := cli(t, nil, "check", "-q", "-f", warned, "-f", clean); code != exitOK || out != lines[0]+"\n" {
		t.Fatalf("-q: exit %d, output:\n%s\nwant the warning alone", code, out)
	}
}

// TestCheckNamesTheMissingRedisOfAnEtcdSection: a section on etcd whose rules say Store: redis
// lacks a Redis only, and is told so, not to name a store.
func TestCheckNamesTheMissingRedisOfAnEtcdSection(t *testing.T) {
	path := writeConfig(t, `Mode: dev
Lock:
  Etcd: {Hosts: [127.0.0.1:2379], Key: flightlock/}
  Rules: [{Method: POST, Path: /a, Key: "a:{uid}", OnBusy: reject, Store: redis}]
`)
	code, out, _ := cli(t, nil, "check", "-q", "-f", path)
	if code != exitOK || !strings.Contains(out, ":2: warning: Lock.Redis has no Host, and its rules with Store: redis lock there (Mode: dev)") ||
		strings.Contains(out, "Etcd.Hosts") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
}

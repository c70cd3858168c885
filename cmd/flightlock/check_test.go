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

// TestCheckGolden runs flightlock check over the fixture service (wallet.api, inventory.proto)
// and one YAML file per mistake, and compares its output and exit status with the
// golden file. Each mistake file must give exactly one finding, the clean ones none, so that a
// check that goes missing fails here even after -update.
func TestCheckGolden(t *testing.T) {
	api := []string{"-api", checkDir + "/wallet.api"}
	proto := []string{"-proto", checkDir + "/inventory.proto"}
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"check", "-f", filepath.Join(checkDir, tt.name+".yaml")}, tt.flags...)
			code, out, errOut := cli(t, nil, args...)
			if errOut != "" {
				t.Fatalf("stderr: %s", errOut)
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if out == "" {
				lines = nil
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
			if line != "" && !strings.Contains(line, ": warning: ") {
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
      Key: "c:{uid}"
      Retry: 3
`)
	code, out, _ := cli(t, nil, "check", "-f", path)
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
	if code, out, _ := cli(t, nil, "check", "-f", path); code != exitError || !strings.Contains(out, ":3: Lock.Redis has no Host (Mode: pro)") {
		t.Fatalf("variable unset: exit %d, output:\n%s\nwant the embedded store refused", code, out)
	}
	t.Setenv("FLIGHTLOCK_CHECK_TEST_REDIS", "redis.internal:6379")
	if code, out, _ := cli(t, nil, "check", "-f", path); code != exitOK || out != "" {
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
	code, out, _ := cli(t, nil, "check", "-f", path)
	want := path + ":4: warning: Api.lock.Redis has no Host (Mode: test)"
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

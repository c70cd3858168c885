package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValueKindIsTheLastWordOfTheFieldWithoutItsIDSuffix(t *testing.T) {
	for ref, want := range map[string]string{
		"uid":                    "uid",
		"body.uid":               "uid",
		"path.account":           "account",
		"body.from_account_id":   "account",
		"toAccount":              "account",
		"account.no":             "account",
		"body.order.id":          "order",
		"user_id":                "user",
		"header.Idempotency-Key": "idempotency",
		"id":                     "", // says how, not what: never compared
		"path.id":                "",
		"jwt.ID":                 "",
	} {
		if got := valueKind(ref); got != want {
			t.Errorf("valueKind(%q) = %q, want %q", ref, got, want)
		}
	}
}

// checkQuiet runs check -q over files and returns its exit status and findings.
func checkQuiet(t *testing.T, files ...string) (int, []string) {
	t.Helper()
	args := []string{"check", "-q"}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	code, out, errOut := cli(t, nil, args...)
	if errOut != "" {
		t.Fatalf("stderr: %s", errOut)
	}
	if out == "" {
		return code, nil
	}
	return code, strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

// TestCheckWarnsOfOneKindLockedUnderTwoShapes: fields whose names end in the same noun name
// one kind of value; a rule that locks it under another shape than the first rule that locks
// it is named, with that rule, once, across the sections of several files under one Prefix.
func TestCheckWarnsOfOneKindLockedUnderTwoShapes(t *testing.T) {
	dir := t.TempDir()
	transfer := filepath.Join(dir, "transfer.yaml")
	withdraw := filepath.Join(dir, "withdraw.yaml")
	for file, yaml := range map[string]string{
		transfer: `Mode: pro
Lock:
  Redis: {Host: 127.0.0.1:6379}
  Rules:
    - {RPC: /bank.Bank/Transfer, Key: "acct:{from_account_id}+acct:{to_account_id}", Wait: 1s}
`,
		withdraw: `Mode: pro
Lock:
  Redis: {Host: 127.0.0.1:6379}
  Rules:
    - {RPC: /bank.Bank/Withdraw, Key: "account:{account}", OnBusy: reject}
    - {RPC: /bank.Bank/Deposit, Key: "account:{account}+idem:{account}:{header.Idempotency-Key}", OnBusy: reject}
`,
	} {
		if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	code, lines := checkQuiet(t, transfer, withdraw)
	want := []string{
		withdraw + ":5: warning: Lock.Rules[0].Key locks {account} as account:{account}, and Lock.Rules[0] (" + transfer +
			":5) locks {from_account_id} as acct:{from_account_id} (both name an account: their field names end in it): " +
			"the two rules never take the same key for one account, so they do not exclude each other; " +
			"if they guard the same account, lock it under one shape in both (acct:{account})",
		withdraw + ":6: warning: Lock.Rules[1].Key locks {account} as account:{account}",
	}
	if code != exitOK || len(lines) != len(want) {
		t.Fatalf("exit %d, findings:\n%s\nwant %d warnings", code, strings.Join(lines, "\n"), len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("finding %d:\n%s\nwant it to start with\n%s", i, lines[i], w)
		}
	}
}

// TestCheckAcceptsOneShapeForOneKind: rules that lock a kind under one shape, whatever their
// sources and sections ({path.account} over REST, {account} over zrpc), composite keys, and
// fields named only by an id word are not reported.
func TestCheckAcceptsOneShapeForOneKind(t *testing.T) {
	path := writeConfig(t, `Mode: pro
Order:
  Lock:
    Redis: {Host: 127.0.0.1:6379}
    Rules:
      - {Method: POST, Path: "/api/account/:account/withdraw", Key: "acct:{path.account}", OnBusy: reject}
      - {Method: POST, Path: /api/order/place, Key: "order:{body.uid}+idem:{body.uid}:{header.Idempotency-Key}", OnBusy: reject}
      - {Method: POST, Path: /api/order/create, Key: "order:{body.uid}", OnBusy: reject}
      - {Method: POST, Path: "/api/sku/:id", Key: "sku:{path.id}", OnBusy: reject}
      - {Method: POST, Path: "/api/order/:id", Key: "order:{path.id}", OnBusy: reject}
Balance:
  Lock:
    Redis: {Host: 127.0.0.1:6379}
    Wait: 1s
    Rules:
      - {RPC: /balance.Balance/Debit, Key: "acct:{account}"}
      - {RPC: /balance.Balance/Transfer, Key: "acct:{from}+acct:{to}"}
`)
	if code, lines := checkQuiet(t, path); code != exitOK || len(lines) != 0 {
		t.Fatalf("exit %d, findings:\n%s\nwant none", code, strings.Join(lines, "\n"))
	}
}

// TestCheckComparesKeyShapesUnderOnePrefixOnly: sections with different Prefixes keep apart
// key spaces on purpose; their rules are not compared.
func TestCheckComparesKeyShapesUnderOnePrefixOnly(t *testing.T) {
	path := writeConfig(t, `Mode: pro
Orders:
  Lock:
    Redis: {Host: 127.0.0.1:6379}
    Prefix: "orders:"
    Rules: [{Method: POST, Path: /a, Key: "order:{body.uid}", OnBusy: reject}]
Users:
  Lock:
    Redis: {Host: 127.0.0.1:6379}
    Prefix: "users:"
    Rules: [{Method: POST, Path: /b, Key: "user:{body.uid}", OnBusy: reject}]
`)
	if code, lines := checkQuiet(t, path); code != exitOK || len(lines) != 0 {
		t.Fatalf("exit %d, findings:\n%s\nwant none", code, strings.Join(lines, "\n"))
	}
}

// TestCheckWarnsOfABareKeyBesideNamespacedOnes: with keys of several namespaces, the fix
// cannot be written for the user; the warning lists the namespaces instead.
func TestCheckWarnsOfABareKeyBesideNamespacedOnes(t *testing.T) {
	path := writeConfig(t, `Mode: pro
Lock:
  Redis: {Host: 127.0.0.1:6379}
  Rules: [{Method: POST, Path: /a, Key: "order:{body.uid}+idem:{body.uid}:{header.Idempotency-Key}+{body.sku}", OnBusy: reject}]
`)
	code, lines := checkQuiet(t, path)
	if code != exitOK || len(lines) != 1 || !strings.Contains(lines[0], `: warning: Lock.Rules[0].Key: the key {body.sku} has no namespace while order:{body.uid} starts with "order:"`) ||
		!strings.HasSuffix(lines[0], "give it the namespace of the value it names (order: or idem:)") {
		t.Fatalf("exit %d, findings:\n%s", code, strings.Join(lines, "\n"))
	}
}

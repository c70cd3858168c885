package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOtherSidesPairsFieldsThatNameTwoSidesOfOneOperation(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"from", "to", true},
		{"To", "FROM", true}, // case-insensitive, either order
		{"src", "dst", true},
		{"src_wallet", "dst_wallet", true},
		{"source", "target", true},
		{"source_account", "destination_account", true},
		{"sender", "receiver", true},
		{"sender", "recipient", true},
		{"payer", "payee", true},
		{"debit_account", "credit_account", true},
		{"buyer_id", "seller_id", true},
		{"from_account", "to_account", true},
		{"fromAccountId", "toAccountId", true},
		{"from_account_id", "toAccount", true}, // one kind, account, by valueKind's rule
		{"from", "from", false},                // one side twice
		{"to_account", "to_wallet", false},
		{"from", "to_account", false},           // a bare side and an account: two kinds
		{"from_account", "to_wallet", false},    // two kinds
		{"source", "dst", false},                // words of two pairs
		{"sender", "payee", false},              // words of two pairs
		{"from_date", "to_date", false},         // the bounds of a range
		{"fromTimestamp", "toTimestamp", false}, // the bounds of a range
		{"from_page", "to_page", false},         // the bounds of a range
		{"today", "fromage", false},             // a side word must be a whole word
		{"account_from", "account_to", false},   // a side word must come first
		{"amount", "to", false},
	} {
		if got := otherSides(tt.a, tt.b); got != tt.want {
			t.Errorf("otherSides(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestOneSidedFieldsNamesTheSideTheTemplateLeavesOut(t *testing.T) {
	field := func(name, typ, ref string) sideField {
		return sideField{name: name, source: "body", typ: typ, ref: ref}
	}
	for _, tt := range []struct {
		name           string
		fields         []sideField
		locked, absent string // the locked and the missing field; "" for no finding
	}{
		{"the source alone", []sideField{field("from", "string", "body.from"), field("to", "string", ""), field("amount", "int64", "")}, "from", "to"},
		{"the target alone", []sideField{field("fromAccountId", "uint64", ""), field("toAccountId", "uint64", "toAccountId")}, "toAccountId", "fromAccountId"},
		{"int ids", []sideField{field("payer", "int", "payer"), field("payee", "int", "")}, "payer", "payee"},
		{"both sides", []sideField{field("from", "string", "body.from"), field("to", "string", "to")}, "", ""},
		{"neither side", []sideField{field("from", "string", ""), field("to", "string", ""), field("amount", "int64", "body.amount")}, "", ""},
		{"one of two names of the other side", []sideField{field("sender", "string", "sender"), field("receiver", "string", ""), field("recipient", "string", "recipient")}, "", ""},
		{"float bounds", []sideField{field("from", "float64", "from"), field("to", "float64", "")}, "", ""},
		{"bool flags", []sideField{field("debit", "bool", "debit"), field("credit", "bool", "")}, "", ""},
		{"a time type", []sideField{field("from", "", "from"), field("to", "", "")}, "", ""},
		{"the other side names no entity", []sideField{field("from", "string", "from"), field("to", "float32", "")}, "", ""},
		// An int64 from/to may be a range of Unix times, which no type or name tells from two
		// ids: it is reported as a transfer would be.
		{"int64 dates", []sideField{field("from", "int64", "from"), field("to", "int64", "")}, "from", "to"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := oneSidedFields(tt.fields)
			switch {
			case tt.locked == "" && len(got) != 0:
				t.Fatalf("got %+v, want none", got)
			case tt.locked != "" && (len(got) != 1 || got[0].locked.name != tt.locked || got[0].missing.name != tt.absent):
				t.Fatalf("got %+v, want %s locked without %s", got, tt.locked, tt.absent)
			}
		})
	}
}

// TestCheckAcceptsBothSidesNeitherOrNoEntities: a rule that locks both sides of a transfer, in
// any order and namespaces, one that reads neither, and pairs that name a range or are not
// strings or integers give no finding; an int64 pair is checked as ids.
func TestCheckAcceptsBothSidesNeitherOrNoEntities(t *testing.T) {
	dir := t.TempDir()
	api := filepath.Join(dir, "ledger.api")
	if err := os.WriteFile(api, []byte(`syntax = "v1"

type (
	MoveReq {
		Src    string `+"`path:\"src\"`"+`
		Dst    string `+"`json:\"dst\"`"+`
		Amount int64  `+"`json:\"amount\"`"+`
	}
	ReportReq {
		FromDate string `+"`form:\"from_date\"`"+`
		ToDate   string `+"`form:\"to_date\"`"+`
		Owner    string `+"`form:\"owner\"`"+`
	}
	ScaleReq {
		From float64 `+"`json:\"from\"`"+`
		To   float64 `+"`json:\"to\"`"+`
		Flag bool    `+"`json:\"flag\"`"+`
	}
	FlipReq {
		Debit  bool   `+"`json:\"debit\"`"+`
		Credit bool   `+"`json:\"credit\"`"+`
		Uid    string `+"`json:\"uid\"`"+`
	}
	RangeReq {
		From int64 `+"`form:\"from\"`"+`
		To   int64 `+"`form:\"to\"`"+`
	}
	Reply {
		Ok bool `+"`json:\"ok\"`"+`
	}
)

service ledger-api {
	@handler move
	post /ledger/:src/move (MoveReq) returns (Reply)
	@handler fee
	post /ledger/:src/fee (MoveReq) returns (Reply)
	@handler report
	post /ledger/report (ReportReq) returns (Reply)
	@handler flip
	post /ledger/flip (FlipReq) returns (Reply)
	@handler range
	post /ledger/range (RangeReq) returns (Reply)
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, `Mode: pro
Lock:
  Redis: {Host: 127.0.0.1:6379}
  Rules:
    - {Method: POST, Path: "/ledger/:src/move", Key: "wallet:{body.dst}+purse:{path.src}", Wait: 1s}
    - {Method: POST, Path: "/ledger/:src/fee", Key: "amount:{body.amount}", OnBusy: reject}
    - {Method: POST, Path: /ledger/report, Key: "report:{form.from_date}", OnBusy: reject}
    - {Method: POST, Path: /ledger/flip, Key: "flip:{body.debit}", OnBusy: reject}
    - {Method: POST, Path: /ledger/range, Key: "range:{query.from}", OnBusy: reject}
`)
	code, out, errOut := cli(t, nil, "check", "-q", "-f", path, "-api", api)
	want := path + `:9: warning: Lock.Rules[4].Key locks {query.from} but not {query.to}, the other side of RangeReq: ` +
		`a range into a range races another that locks it; lock both sides: "range:{query.from}+range:{query.to}"`
	if code != exitOK || errOut != "" || !strings.HasPrefix(out, want) || strings.Count(out, "\n") != 1 {
		t.Fatalf("exit %d, output:\n%s%s\nwant the int64 pair's warning alone:\n%s", code, out, errOut, want)
	}
}

// TestCheckWarnsOfOneSideOfAnRPCRequestOnly: over zrpc the pair is found among the request
// message's proto fields; a rule that locks both sides of it gives no finding.
func TestCheckWarnsOfOneSideOfAnRPCRequestOnly(t *testing.T) {
	const conf = "Mode: pro\nLock:\n  Redis: {Host: 127.0.0.1:6379}\n  Wait: 1s\n  Rules: [{RPC: /bank.Bank/Transfer, Key: %q}]\n"
	path := writeConfig(t, fmt.Sprintf(conf, "acct:{from_account_id}"))
	code, out, _ := cli(t, nil, "check", "-q", "-f", path, "-proto", checkDir+"/bank.proto")
	want := path + `:5: warning: Lock.Rules[0].Key locks {from_account_id} but not {to_account_id}, the other side of ` +
		`bank.TransferRequest: a transfer into an account races another that locks it; lock both sides: ` +
		`"acct:{from_account_id}+acct:{to_account_id}" (the same account twice is one lock)` + "\n"
	if code != exitOK || out != want {
		t.Fatalf("one side: exit %d, output:\n%s\nwant:\n%s", code, out, want)
	}
	path = writeConfig(t, fmt.Sprintf(conf, "acct:{to_account_id}+acct:{from_account_id}"))
	if code, out, _ := cli(t, nil, "check", "-q", "-f", path, "-proto", checkDir+"/bank.proto"); code != exitOK || out != "" {
		t.Fatalf("both sides: exit %d, output:\n%s\nwant none", code, out)
	}
}

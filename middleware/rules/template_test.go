package rules

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/flightlock/flightlock"
)

func TestParseTemplate(t *testing.T) {
	tests := []struct {
		tmpl string
		keys int // 0: must fail
	}{
		{"order:{uid}", 1},
		{"acct:{from}+acct:{to}", 2},
		{"sku:{path.sku}:{header.X-Tenant}", 1},
		{"report:daily", 1},
		{"{uid}", 1},
		{"a:{body.order.id}", 1},
		{"", 0},
		{"order:{uid", 0},
		{"order:uid}", 0},
		{"order:{}", 0},
		{"order:{a..b}", 0},
		{"order:{a b}", 0},
		{"acct:{from}+", 0},
		{"+acct:{to}", 0},
		{"{a}{b}", 0},
		{"{a}-{b}", 0},
		{"{a}:{b}", 1},
		{"{a}x:y{b}", 1},
		{"line\n{a}", 0},
	}
	for _, tt := range tests {
		keys, err := TemplateKeys(tt.tmpl)
		if tt.keys == 0 {
			if err == nil {
				t.Errorf("TemplateKeys(%q) = %v, want an error", tt.tmpl, keys)
			}
			continue
		}
		if err != nil || len(keys) != tt.keys {
			t.Errorf("TemplateKeys(%q) = %d keys, %v; want %d keys", tt.tmpl, len(keys), err, tt.keys)
		}
	}
}

// renderWith renders tmpl with the values of refs in order.
func renderWith(t testing.TB, tmpl string, values []string) ([]string, error) {
	keys, err := TemplateKeys(tmpl)
	if err != nil {
		t.Fatalf("TemplateKeys(%q): %v", tmpl, err)
	}
	i := 0
	plan, err := bindPlan(keys, func(string) (getter[[]string], error) {
		n := i
		i++
		return func(vs []string) (string, bool, error) {
			if n >= len(vs) {
				return "", false, nil
			}
			return vs[n], true, nil
		}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return plan(values)
}

func TestRenderEscapes(t *testing.T) {
	tests := []struct {
		tmpl   string
		values []string
		want   string
	}{
		{"order:{uid}", []string{"42"}, "order:42"},
		{"order:{uid}", []string{"a:b"}, "order:a%3Ab"},
		{"order:{uid}", []string{"50%"}, "order:50%25"},
		{"order:{uid}", []string{"{tag}+x"}, "order:%7Btag%7D%2Bx"},
		{"order:{uid}", []string{"a\nb\x00\x7f"}, "order:a%0Ab%00%7F"},
		{"order:{uid}", []string{"Zoë ok/é"}, "order:Zoë ok/é"},
	}
	for _, tt := range tests {
		got, err := renderWith(t, tt.tmpl, tt.values)
		if err != nil || len(got) != 1 || got[0] != tt.want {
			t.Errorf("render(%q, %q) = %q, %v; want %q", tt.tmpl, tt.values, got, err, tt.want)
		}
	}
}

func TestRenderMissingValue(t *testing.T) {
	for _, values := range [][]string{nil, {""}, {"x"}} {
		_, err := renderWith(t, "acct:{from}+acct:{to}", values)
		if !errors.Is(err, flightlock.ErrInvalidKey) {
			t.Errorf("render with %q: err %v, want ErrInvalidKey", values, err)
		}
	}
}

// TestRenderNoCollision checks pairs of different inputs that would collide without escaping
// or without the separator rule.
func TestRenderNoCollision(t *testing.T) {
	tests := []struct {
		tmpl string
		a, b []string
	}{
		{"{x}:{y}", []string{"a:b", "c"}, []string{"a", "b:c"}},
		{"o:{x}", []string{"1%3A2"}, []string{"1:2"}},
		{"o:{x}", []string{"%25"}, []string{"%"}},
		{"{x}:{y}:z", []string{"a", "b:z"}, []string{"a:b", "z"}},
		{"{x}+{y}", []string{"a+b", "c"}, []string{"a", "b+c"}},
		{"t:{x}:{y}", []string{"1", ":2"}, []string{"1:", "2"}},
	}
	for _, tt := range tests {
		ka, errA := renderWith(t, tt.tmpl, tt.a)
		kb, errB := renderWith(t, tt.tmpl, tt.b)
		if errA != nil || errB != nil {
			t.Fatalf("%q: %v, %v", tt.tmpl, errA, errB)
		}
		if strings.Join(ka, "\x00") == strings.Join(kb, "\x00") {
			t.Errorf("%q: %q and %q both render %q", tt.tmpl, tt.a, tt.b, ka)
		}
	}
}

// FuzzTemplate parses arbitrary templates and renders the valid ones with two sets of
// values: the parser must not panic, and two different sets must never give the same keys.
func FuzzTemplate(f *testing.F) {
	f.Add("order:{uid}", "42", "43")
	f.Add("acct:{from}+acct:{to}", "1|2", "1|2:")
	f.Add("{a}:{b}", "x:|y", "x|:y")
	f.Add("k:{a}:{b}:{c}", "%|:|+", "%25|%3A|%2B")
	f.Add("{a}x:y{b}", "1x|y2", "1|x:y2")
	f.Fuzz(func(t *testing.T, tmpl, x, y string) {
		keys, err := TemplateKeys(tmpl)
		if err != nil {
			return
		}
		refs := 0
		for _, k := range keys {
			if k.Text == "" || len(k.lits) != len(k.Refs)+1 || k.Shape != strings.Join(k.lits, "{}") {
				t.Fatalf("TemplateKeys(%q) gave an empty or malformed key: %+v", tmpl, k)
			}
			refs += len(k.Refs)
		}
		a, b := splitValues(x, refs), splitValues(y, refs)
		ka, errA := renderWith(t, tmpl, a)
		kb, errB := renderWith(t, tmpl, b)
		if errA != nil || errB != nil {
			t.Fatalf("render(%q): %v, %v", tmpl, errA, errB)
		}
		for _, k := range ka {
			if k == "" {
				t.Fatalf("render(%q, %q) gave an empty key", tmpl, a)
			}
		}
		if strings.Join(ka, "\x00") == strings.Join(kb, "\x00") && strings.Join(a, "\x00") != strings.Join(b, "\x00") {
			t.Fatalf("template %q: values %q and %q both render %q", tmpl, a, b, ka)
		}
		// Each rendered value decodes back to the input: the escaping loses nothing.
		for _, v := range a {
			var sb strings.Builder
			escape(&sb, v)
			if got, err := url.PathUnescape(sb.String()); err != nil || got != v {
				t.Fatalf("escape(%q) = %q, decodes to %q, %v", v, sb.String(), got, err)
			}
		}
	})
}

// splitValues cuts s on '|' into n non-empty values.
func splitValues(s string, n int) []string {
	parts := strings.SplitN(s, "|", max(n, 1))
	out := make([]string, n)
	for i := range out {
		out[i] = "v"
		if i < len(parts) && parts[i] != "" {
			out[i] = parts[i]
		}
	}
	return out
}

// The middleware keeps its own keys under Prefix beside the locks of enforced rules: share
// rules' stored responses under "replay:", shadow rules' locks under "shadow:". An enforced
// rule whose template puts a key there in its text is refused at start-up (Validate, New,
// flightlock check), and a request whose values put a key there is refused with 400 /
// InvalidArgument, as is such a key of a KeyFunc. A shadow rule's keys live under "shadow:"
// themselves, apart from both: its templates are free.
func TestEnforcedRuleKeysStayOutOfInternalKeys(t *testing.T) {
	rule := func(key string, shadow bool) Rule {
		return Rule{Method: "POST", Path: "/x", Key: key, Shadow: shadow}
	}
	validate := func(r Rule) error { return LockConf{Rules: []Rule{r}}.Validate() }
	for _, key := range []string{"replay:pay:{header.X-Uid}", "shadow:x:{header.X-Uid}", "acct:{header.X-A}+replay:{header.X-B}", "replay:"} {
		err := validate(rule(key, false))
		if !errors.Is(err, flightlock.ErrConfig) || !strings.Contains(err.Error(), "Lock.Rules[0].Key") {
			t.Errorf("Key %q: %v, want an ErrConfig naming Lock.Rules[0].Key", key, err)
		}
		if err := validate(rule(key, true)); err != nil {
			t.Errorf("Key %q of a shadow rule: %v, want it accepted", key, err)
		}
	}
	for _, key := range []string{"replayed:{header.X-Uid}", "x:replay:{header.X-Uid}", "replay{header.X-Uid}", "{header.X-Uid}:replay"} {
		if err := validate(rule(key, false)); err != nil {
			t.Errorf("Key %q: %v, want it accepted", key, err)
		}
	}

	request := func(kind string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/x", http.NoBody)
		r.Header.Set("X-Kind", kind)
		r.Header.Set("X-Uid", "u1")
		return r
	}
	for _, tc := range []struct {
		key    string
		shadow bool
		kind   string
		want   string // "" for a refusal
	}{
		{"{header.X-Kind}:pay:{header.X-Uid}", false, "replay", ""},
		{"{header.X-Kind}:pay:{header.X-Uid}", false, "shadow", ""},
		{"a:{header.X-Uid}+{header.X-Kind}:{header.X-Uid}", false, "replay", ""},
		{"{header.X-Kind}:pay:{header.X-Uid}", false, "replayed", "replayed:pay:u1"},
		{"{header.X-Kind}:pay:{header.X-Uid}", false, "Replay", "Replay:pay:u1"},
		{"{header.X-Kind}:pay:{header.X-Uid}", true, "replay", "replay:pay:u1"},
	} {
		rl, err := CompileHTTP(Spec{Rule: rule(tc.key, tc.shadow), Field: "Lock.Rules[0]"})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := rl.HTTPKeys(request(tc.kind))
		switch {
		case tc.want == "" && !errors.Is(err, flightlock.ErrInvalidKey):
			t.Errorf("%q with %s (shadow %v): %q, %v; want ErrInvalidKey", tc.key, tc.kind, tc.shadow, keys, err)
		case tc.want != "" && (err != nil || len(keys) != 1 || keys[0] != tc.want):
			t.Errorf("%q with %s (shadow %v): %q, %v; want %q", tc.key, tc.kind, tc.shadow, keys, err, tc.want)
		}
	}

	for _, k := range []string{"replay:pay:u1", "shadow:x"} {
		rl, err := CompileHTTP(Spec{Rule: Rule{Method: "POST", Path: "/x"}, Field: "Route(POST /x)",
			HTTPKey: func(*http.Request) (string, error) { return k, nil }})
		if err != nil {
			t.Fatal(err)
		}
		if keys, err := rl.HTTPKeys(request("")); !errors.Is(err, flightlock.ErrInvalidKey) {
			t.Errorf("a KeyFunc's key %q: %q, %v; want ErrInvalidKey", k, keys, err)
		}
	}
}

func TestTemplateKeysGiveEachKeyItsShapeAndNamespace(t *testing.T) {
	keys, err := TemplateKeys("acct:{body.from}+{body.to}+idem:{uid}:{header.Idempotency-Key}")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ text, shape, ns string }{
		{"acct:{body.from}", "acct:{}", "acct:"},
		{"{body.to}", "{}", ""},
		{"idem:{uid}:{header.Idempotency-Key}", "idem:{}:{}", "idem:"},
	}
	if len(keys) != len(want) {
		t.Fatalf("TemplateKeys = %+v, want %d keys", keys, len(want))
	}
	for i, w := range want {
		if k := keys[i]; k.Text != w.text || k.Shape != w.shape || k.Namespace() != w.ns {
			t.Errorf("key %d = %+v (namespace %q), want text %q, shape %q, namespace %q", i, k, k.Namespace(), w.text, w.shape, w.ns)
		}
	}
	if got := keys[2].Refs; len(got) != 2 || got[0] != "uid" || got[1] != "header.Idempotency-Key" {
		t.Errorf("refs of the third key = %q", got)
	}
	if _, err := TemplateKeys("acct:{from"); err == nil {
		t.Error("TemplateKeys of an unclosed brace: no error")
	}
}

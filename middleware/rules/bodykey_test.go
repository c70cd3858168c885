package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flightlock/flightlock"
)

// decoderBodyValue is the reference reading of {body.x.y}, with two decoders: the body's first
// value through a json.Decoder, then the field's value through another one with UseNumber.
// bodyValue, which decodes in one pass, must give what it gives, for every body.
func decoderBodyValue(body string, path []string) (string, bool) {
	var obj map[string]json.RawMessage
	if len(body) > 0 && json.NewDecoder(strings.NewReader(body)).Decode(&obj) != nil {
		obj = nil
	}
	var raw json.RawMessage
	for i, p := range path {
		var ok bool
		if raw, ok = obj[p]; !ok {
			return "", false
		}
		if i < len(path)-1 {
			obj = nil
			if json.Unmarshal(raw, &obj) != nil {
				return "", false
			}
		}
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return "", false
	}
	return scalar(v)
}

func checkBodyValue(t *testing.T, body string, path []string) {
	t.Helper()
	r := httptest.NewRequest("POST", "/x", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	got, gotOK, err := (&httpSource{r: r}).bodyValue(path)
	if err != nil {
		t.Fatalf("body %q path %q: %v", body, path, err)
	}
	want, wantOK := decoderBodyValue(body, path)
	if got != want || gotOK != wantOK {
		t.Fatalf("body %q path %q: got %q, %v; the decoder gives %q, %v", body, path, got, gotOK, want, wantOK)
	}
}

var bodyKeyCases = []string{
	`{"uid":"u1"}`,
	`{"uid":"u1"}  `,
	`{"uid":"u1"} {"uid":"u2"}`, // data after the first value: go-zero's decoder reads the first
	`{"uid":"u1"} garbage`,
	`{"uid":"u1","uid":"u2"}`, // the last of a repeated field, as go-zero binds it
	`{"uid":"\u0075\n\"x\""}`,
	`{"\u0075id":"escaped name"}`,
	`{"uid":"\xff\xfe"}`, // invalid UTF-8 becomes U+FFFD in both
	`{"uid":12345678901234567890}`,
	`{"uid":-1.5e+300}`,
	`{"uid":0}`,
	`{"uid":true}`,
	`{"uid":false}`,
	`{"uid":null}`,
	`{"uid":{"id":"n1"}}`,
	`{"uid":["a"]}`,
	`{"uid": "spaced" }`,
	`{"a":{"b":"deep","b":7}}`,
	`{"a":[1]}`,
	`{"a":"not an object"}`,
	`["uid"]`,
	`"uid"`,
	`null`,
	`{"uid":"u1"`,
	`{"uid":01}`,
	`{"uid":"u1",}`,
	``,
	` `,
}

// TestBodyValueAsTheDecoderReadsIt: the one-pass decode of a JSON body key gives the value the
// two Decoders gave, including bodies with data after the first value, repeated fields,
// escapes and values that are not scalars.
func TestBodyValueAsTheDecoderReadsIt(t *testing.T) {
	for _, body := range bodyKeyCases {
		for _, path := range [][]string{{"uid"}, {"a", "b"}, {"uid", "id"}} {
			checkBodyValue(t, body, path)
		}
	}
}

func FuzzBodyValueAsTheDecoderReadsIt(f *testing.F) {
	for _, body := range bodyKeyCases {
		f.Add(body, false)
		f.Add(body, true)
	}
	f.Fuzz(func(t *testing.T, body string, nested bool) {
		path := []string{"uid"}
		if nested {
			path = []string{"a", "b"}
		}
		checkBodyValue(t, body, path)
	})
}

// TestMissingBodyValueSaysWhyTheBodyWasNotRead: a {body.x} whose body go-zero does not read as
// JSON (another Content-Type, no length) is refused with what the request must send, so that
// the client's 400 says how to fix it; a JSON body that lacks the field says only that.
func TestMissingBodyValueSaysWhyTheBodyWasNotRead(t *testing.T) {
	rl, err := CompileHTTP(Spec{Rule: Rule{Method: "POST", Path: "/pay", Key: "pay:{body.uid}"}, Field: "Lock.Rules[0]"})
	if err != nil {
		t.Fatal(err)
	}
	request := func(ctype, body string, length int64) *http.Request {
		r := httptest.NewRequest("POST", "/pay", strings.NewReader(body))
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		r.ContentLength = length
		return r
	}
	const alice = `{"uid":"alice"}`
	for _, tc := range []struct {
		name string
		r    *http.Request
		want string
	}{
		{"text/plain", request("text/plain", alice, int64(len(alice))),
			`flightlock: invalid lock key: no value for {body.uid}: go-zero reads the body as JSON only with Content-Type: application/json (this request sends "text/plain")`},
		{"no content type", request("", alice, int64(len(alice))),
			`flightlock: invalid lock key: no value for {body.uid}: go-zero reads the body as JSON only with Content-Type: application/json (this request sends none)`},
		{"unknown length", request("application/json", alice, -1),
			`flightlock: invalid lock key: no value for {body.uid}: go-zero reads a JSON body only when the request gives its Content-Length (this one is chunked or of unknown length)`},
		{"json without the field", request("application/json", `{"id":1}`, 8),
			`flightlock: invalid lock key: no value for {body.uid}`},
		{"no body", request("", "", 0),
			`flightlock: invalid lock key: no value for {body.uid}`},
	} {
		keys, err := rl.HTTPKeys(tc.r)
		if !errors.Is(err, flightlock.ErrInvalidKey) || err.Error() != tc.want {
			t.Errorf("%s: %q, %v; want ErrInvalidKey %q", tc.name, keys, err, tc.want)
		}
	}
}

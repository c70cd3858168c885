package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/rest/pathvar"
)

// KeyFunc computes the lock key of a REST request in Go, for WithHTTPRule and RouteFunc. An
// error, an empty key or one of the middleware's own ("replay:...", "shadow:...") answers 400.
// The key is used as is: escape user input so that requests cannot forge each other's key.
type KeyFunc func(r *http.Request) (string, error)

// MaxBodyBytes bounds the body a template reads for {form.x} and {body.x}: larger answers 400.
const MaxBodyBytes = 1 << 20

// httpSource is one request as the key getters see it, its body, form and JSON object read on
// first use. The key must hold the value the handler binds with go-zero's httpx.Parse
// (v1.10.3), so each getter reads a source exactly when, and as, Parse would: path variables;
// the form (query, urlencoded body of POST, PUT and PATCH, multipart text fields; empty values
// dropped, "name[]" as "name"); headers; the first JSON value of a body with ContentLength > 0
// and a Content-Type containing "application/json". Which value a field gets depends on the
// handler's struct, so a name that sources, or values of one, give differently is refused.
type httpSource struct {
	r    *http.Request
	raw  bool // the values as written, without canonicalValue (replay keys of share rules)
	body once[[]byte]
	form once[httpForm]
	json once[map[string]json.RawMessage] // the body's top-level fields, undecoded; nil if not an object
}

// httpForm is a request's form as go-zero's binding sees it.
type httpForm struct {
	query url.Values // the URL query
	all   url.Values // r.Form as ParseForm and ParseMultipartForm leave it: query and body
	body  url.Values // the body's part of all
}

// once is a value computed on first use, with its error.
type once[T any] struct {
	v    T
	err  error
	done bool
}

func (o *once[T]) get(compute func() (T, error)) (T, error) {
	if !o.done {
		o.done = true
		o.v, o.err = compute()
	}
	return o.v, o.err
}

func (s *httpSource) readBody() ([]byte, error) {
	return s.body.get(func() ([]byte, error) { return ReadBody(s.r) })
}

// ReadBody reads r's body, put back for the handler; a failed read or over MaxBodyBytes is 400.
func ReadBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(b))
	switch {
	case err != nil:
		return b, fmt.Errorf("%w: read request body: %w", flightlock.ErrInvalidKey, err)
	case len(b) > MaxBodyBytes:
		return b, fmt.Errorf("%w: request body over %d bytes", flightlock.ErrInvalidKey, MaxBodyBytes)
	}
	return b, nil
}

// formReadsBody reports whether r.ParseForm or ParseMultipartForm would read r's body, once: an
// urlencoded one of POST, PUT and PATCH (even with a bad media type parameter), or multipart.
func formReadsBody(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case mt == "application/x-www-form-urlencoded":
		return r.PostForm == nil && (r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch)
	case mt == "multipart/form-data" && err == nil:
		return r.MultipartForm == nil
	}
	return false
}

// parseForm reads the form as httpx.GetFormValues sees r.Form, running net/http's parsers on a
// copy of r that reads the buffered body: r keeps its body and unparsed form for the handler.
func (s *httpSource) parseForm() (httpForm, error) {
	r := s.r
	c := r.WithContext(r.Context()) // a shallow copy: its maps are cloned below, nil staying nil
	c.Form, c.PostForm = url.Values(http.Header(r.Form).Clone()), url.Values(http.Header(r.PostForm).Clone())
	if r.Body != nil { // a nil body is "missing form body" for net/http, as for the handler
		c.Body = http.NoBody
		if formReadsBody(r) {
			b, err := s.readBody()
			if err != nil {
				return httpForm{}, err
			}
			c.Body = io.NopCloser(bytes.NewReader(b))
		}
	}
	err := c.ParseForm()
	if err == nil {
		// Up to MaxBodyBytes of file parts stay in memory: the body is no larger.
		if err = c.ParseMultipartForm(MaxBodyBytes); errors.Is(err, http.ErrNotMultipart) {
			err = nil
		}
	}
	if c.MultipartForm != nil && c.MultipartForm != r.MultipartForm {
		_ = c.MultipartForm.RemoveAll()
	}
	if err != nil {
		return httpForm{}, fmt.Errorf("%w: form: %v", flightlock.ErrInvalidKey, err)
	}
	query, _ := url.ParseQuery(r.URL.RawQuery) // ParseForm reported a malformed query
	return httpForm{query: query, all: c.Form, body: c.PostForm}, nil
}

// formField adds to c the values of name that go-zero's form binding sees ("name[]" included,
// empty values dropped, as GetFormValues does), under the parts of the form that hold them.
func (s *httpSource) formField(c *candidates, name string) (inQuery, inBody bool, err error) {
	f, err := s.form.get(s.parseForm)
	if err != nil {
		return false, false, err
	}
	has := func(v url.Values) bool {
		return slices.ContainsFunc(v[name], nonEmpty) || slices.ContainsFunc(v[name+"[]"], nonEmpty)
	}
	inQuery, inBody = has(f.query), has(f.body)
	sources := []string{"the form"}
	switch {
	case inQuery && inBody:
		sources = []string{"the query", "the form body"}
	case inQuery:
		sources = []string{"the query"}
	case inBody:
		sources = []string{"the form body"}
	}
	c.add(slices.DeleteFunc(slices.Concat(f.all[name], f.all[name+"[]"]), func(v string) bool { return v == "" }), sources...)
	return inQuery, inBody, nil
}

func nonEmpty(v string) bool { return v != "" }

// decodeJSON decodes the body's first JSON value as httpx.ParseJsonBody does, if it would
// (go-zero's withJsonBody test, on a body that ParseForm, first, left unread).
func (s *httpSource) decodeJSON() (map[string]json.RawMessage, error) {
	r := s.r
	if r.ContentLength <= 0 || !strings.Contains(r.Header.Get("Content-Type"), "application/json") || formReadsBody(r) {
		return nil, nil
	}
	b, err := s.readBody()
	if err != nil || len(b) == 0 {
		return nil, err
	}
	// Unmarshal avoids a Decoder's copy but, unlike go-zero's Decoder, refuses data after a value.
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil {
		obj = nil
		if json.NewDecoder(bytes.NewReader(b)).Decode(&obj) != nil {
			obj = nil // not a JSON object: every body field is missing
		}
	}
	return obj, nil
}

// unreadBody is the error of a {body.x} without a value because httpx.Parse would not read the
// body as JSON (decodeJSON's test); nil when there is no body, or it was read and lacks the field.
func unreadBody(r *http.Request, ref string) error {
	ctype := r.Header.Get("Content-Type")
	switch {
	case r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody:
		return nil
	case !strings.Contains(ctype, "application/json"):
		sends := "none"
		if ctype != "" {
			sends = strconv.Quote(ctype)
		}
		return fmt.Errorf("%w: no value for {%s}: go-zero reads the body as JSON only with Content-Type: application/json (this request sends %s)",
			flightlock.ErrInvalidKey, ref, sends)
	case r.ContentLength < 0:
		return fmt.Errorf("%w: no value for {%s}: go-zero reads a JSON body only when the request gives its Content-Length (this one is chunked or of unknown length)",
			flightlock.ErrInvalidKey, ref)
	}
	return nil
}

// bodyValue follows a dotted path into the JSON body, splitting only the objects on the path:
// a large body costs a scan, not a tree of maps.
func (s *httpSource) bodyValue(path []string) (string, bool, error) {
	obj, err := s.json.get(s.decodeJSON)
	if err != nil {
		return "", false, err
	}
	var raw json.RawMessage
	for i, p := range path {
		var ok bool
		if raw, ok = obj[p]; !ok {
			return "", false, nil
		}
		if i < len(path)-1 {
			obj = nil
			if json.Unmarshal(raw, &obj) != nil {
				return "", false, nil // a scalar or an array where the path goes on
			}
		}
	}
	str, ok := scalarJSON(raw)
	return str, ok, nil
}

// scalarJSON renders a checked JSON value as scalar renders it decoded with UseNumber.
func scalarJSON(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	switch c := raw[0]; {
	case c == '"':
		var s string
		return s, json.Unmarshal(raw, &s) == nil
	case c == '-' || (c >= '0' && c <= '9'):
		return string(raw), true
	case c == 't' || c == 'f':
		return strconv.FormatBool(c == 't'), true
	}
	return "", false // null, an object or an array
}

// candidates gathers the distinct values that the sources of one reference give.
type candidates struct {
	vals    []string // distinct, in the order seen
	sources []string // the sources that gave a value, in the order seen
}

func (c *candidates) add(vals []string, sources ...string) {
	if len(vals) == 0 {
		return
	}
	c.sources = append(c.sources, sources...)
	for _, v := range vals {
		if !slices.Contains(c.vals, v) {
			c.vals = append(c.vals, v)
		}
	}
}

// one returns the single value of ref, or an ErrInvalidKey naming the sources that disagree
// (never their values: the message goes back to the client), with hint.
func (c *candidates) one(ref, hint string) (string, bool, error) {
	switch len(c.vals) {
	case 0:
		return "", false, nil
	case 1:
		return c.vals[0], true, nil
	}
	what := c.sources[0] + " has several values"
	if n := len(c.sources); n > 1 {
		what = strings.Join(c.sources[:n-1], ", ") + " and " + c.sources[n-1] + " give different values"
	}
	return "", false, fmt.Errorf("%w: {%s} is ambiguous: %s; %s", flightlock.ErrInvalidKey, ref, what, hint)
}

// scalar renders a JSON or JWT claim value: strings, numbers and booleans, no other values.
func scalar(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case json.Number:
		return v.String(), true
	case bool:
		return strconv.FormatBool(v), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	}
	return "", false
}

// bindHTTP binds a reference to its REST getter, values canonical (canonicalValue) unless the
// source is raw; route, if known, lets {path.x} be checked at start-up.
func bindHTTP(route *Route) func(ref string) (getter[*httpSource], error) {
	return func(ref string) (getter[*httpSource], error) {
		get, err := httpGetter(route, ref)
		if err != nil {
			return nil, err
		}
		return func(s *httpSource) (string, bool, error) {
			v, ok, err := get(s)
			if s.raw {
				return v, ok, err
			}
			return canonicalValue(v), ok, err
		}, nil
	}
}

// canonicalValue returns v in one form for every way of writing the bool or number httpx.Parse
// binds from it, else v. go-zero binds "1" and any case of "true" as true, "0" and "false" as
// false: they render "1" and "0", as integers (and zrpc bools) do. A string field holding
// "true" (or "007") then shares a lock with "1" (or "7"): a wait, never a second holder.
func canonicalValue(v string) string {
	switch {
	case strings.EqualFold(v, "true"):
		return "1"
	case strings.EqualFold(v, "false"):
		return "0"
	}
	return canonicalNumber(v)
}

// canonicalNumber returns v in one form for every way of writing its number, else v: httpx.Parse
// binds "7", "07" and "+7" as one integer, 1, 1.0, 1e0 and 0x1p0 as one float, so two requests
// on one entity must not both hold "their" lock. Integers are rewritten exactly, at any length:
// the sign of zero, a "+" and leading zeros go. Any other finite number ParseFloat reads is
// that float64: its digits when integral, else Go's shortest form. (An integer beyond 2^53
// written once with a point or exponent stays apart.)
func canonicalNumber(v string) string {
	sign, digits := "", v
	if v != "" && (v[0] == '+' || v[0] == '-') {
		sign, digits = strings.TrimPrefix(v[:1], "+"), v[1:]
	}
	if digits != "" && strings.Trim(digits, "0123456789") == "" {
		if d := strings.TrimLeft(digits, "0"); d != "" {
			return sign + d
		}
		return "0"
	}
	// Skip ParseFloat, whose error allocates, for text that starts as no number or word it reads.
	if w := strings.TrimLeft(v, "+-"); w == "" || !strings.ContainsRune("0123456789.iInN", rune(w[0])) {
		return v
	}
	f, err := strconv.ParseFloat(v, 64)
	switch {
	case err != nil: // 1e400 too: out of range
		return v
	case math.IsNaN(f): // the words in any case ("+inf", "INFINITY") in one form
		return "NaN"
	case math.IsInf(f, 1):
		return "Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case f == 0:
		return "0"
	case f == math.Trunc(f):
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// httpGetter is the REST getter of one template reference.
func httpGetter(route *Route, ref string) (getter[*httpSource], error) {
	src, name, dotted := strings.Cut(ref, ".")
	if !dotted {
		return defaultGetter(ref), nil
	}
	switch src {
	case "path":
		if route != nil && !slices.Contains(route.Params, name) {
			return nil, fmt.Errorf("{%s}: route %s has no :%s", ref, route.Text, name)
		}
		return func(s *httpSource) (string, bool, error) {
			v := pathvar.Vars(s.r)[name]
			return v, v != "", nil
		}, nil
	case "query", "form":
		// The value must be in that part, and the merged form go-zero binds must hold no other.
		return func(s *httpSource) (string, bool, error) {
			var c candidates
			inQuery, inBody, err := s.formField(&c, name)
			if err != nil || (src == "query" && !inQuery) || (src == "form" && !inBody) {
				return "", false, err
			}
			return c.one(ref, "send one value")
		}, nil
	case "body":
		path := strings.Split(name, ".")
		return func(s *httpSource) (string, bool, error) {
			v, ok, err := s.bodyValue(path)
			if !ok && err == nil {
				err = unreadBody(s.r, ref)
			}
			return v, ok, err
		}, nil
	case "header":
		return func(s *httpSource) (string, bool, error) {
			var c candidates // a repeated header with different values has none
			c.add(s.r.Header.Values(name), "the header")
			return c.one(ref, "send one value")
		}, nil
	case "jwt":
		// go-zero's JWT handler stores each custom claim under its name, a string context key.
		return func(s *httpSource) (string, bool, error) {
			v, ok := scalar(s.r.Context().Value(name))
			return v, ok && v != "", nil
		}, nil
	}
	return nil, fmt.Errorf("unknown source %q in {%s} (path, query, form, body, header or jwt)", src, ref)
}

// defaultGetter resolves a bare name from every source httpx.Parse could bind it from, which
// must agree: the handler's struct decides which wins.
func defaultGetter(name string) getter[*httpSource] {
	path := []string{name}
	hint := fmt.Sprintf("send one value, or name the source the handler binds, such as {path.%[1]s}, {query.%[1]s}, {form.%[1]s}, {header.%[1]s} or {body.%[1]s}", name)
	return func(s *httpSource) (string, bool, error) {
		var c candidates
		if v := pathvar.Vars(s.r)[name]; v != "" {
			c.add([]string{v}, "the path variable")
		}
		if _, _, err := s.formField(&c, name); err != nil {
			return "", false, err
		}
		c.add(s.r.Header.Values(name), "the header")
		v, ok, err := s.bodyValue(path)
		if err != nil {
			return "", false, err
		}
		if ok {
			c.add([]string{v}, "the JSON body") // "" too: Parse binds it over the form's value
		}
		return c.one(name, hint)
	}
}

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

// KeyFunc computes the lock key of a REST request in Go, for WithHTTPRule and RouteFunc. An error,
// an empty key or a key among the middleware's own ("replay:...", "shadow:...") answers 400
// without running the handler; the error need not wrap flightlock.ErrInvalidKey. The key is
// used as is: escape user input so that different requests cannot forge each other's key.
type KeyFunc func(r *http.Request) (string, error)

// MaxBodyBytes bounds the request body that a template reads for {form.x} and {body.x}:
// a larger body answers 400 (before go-zero's MaxBytes, which is 1 MiB by default, too).
const MaxBodyBytes = 1 << 20

// The key must be built from the value that the handler binds with go-zero's httpx.Parse,
// so every getter reads a source exactly when, and as, Parse
// would (go-zero v1.10.3, rest/httpx/requests.go and util.go):
//   - ParsePath binds the route's path variables (pathvar.Vars);
//   - ParseForm binds r.Form after r.ParseForm and r.ParseMultipartForm (GetFormValues): the URL
//     query, plus an urlencoded body of POST, PUT and PATCH, plus the text fields of a
//     multipart/form-data body. Empty values are dropped, "name[]" binds as "name", and a
//     scalar field takes the first of several values;
//   - ParseHeaders binds the header's values (a field tagged header:"uid" reads the header Uid);
//   - ParseJsonBody decodes the first JSON value of the body only when ContentLength > 0 and
//     the Content-Type contains "application/json" (withJsonBody); a chunked body, one of
//     unknown length or a JSON body sent as text/plain is not read.
// Parse binds them in that order, each over the fields its tag names, so which value a field
// ends with depends on the handler's struct. A name that two sources, or two values of one
// source, give differently is therefore refused rather than guessed.

// httpSource is one request as seen by the key getters. The body, the form and the JSON
// object are read once, on first use.
type httpSource struct {
	r   *http.Request
	raw bool // the values as written, without canonicalValue (replay keys of share rules)

	body     []byte
	bodyErr  error
	bodyRead bool

	query    url.Values // the URL query
	form     url.Values // r.Form as ParseForm and ParseMultipartForm leave it: query and body
	postForm url.Values // the body's part of form
	formErr  error
	formDone bool

	json     map[string]json.RawMessage // the body's top-level fields, undecoded; nil if not an object
	jsonErr  error
	jsonDone bool
}

// readBody reads the body up to MaxBodyBytes and puts it back, so that the handler's
// httpx.Parse reads it again.
func (s *httpSource) readBody() ([]byte, error) {
	if s.bodyRead {
		return s.body, s.bodyErr
	}
	s.bodyRead = true
	if s.r.Body == nil || s.r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(s.r.Body, MaxBodyBytes+1))
	_ = s.r.Body.Close()
	// Whatever happened, the handler gets what was read: nothing is lost for it.
	s.r.Body = io.NopCloser(bytes.NewReader(b))
	switch {
	case err != nil:
		s.bodyErr = fmt.Errorf("%w: read request body: %v", flightlock.ErrInvalidKey, err)
	case len(b) > MaxBodyBytes:
		s.bodyErr = fmt.Errorf("%w: request body over %d bytes", flightlock.ErrInvalidKey, MaxBodyBytes)
	}
	s.body = b
	return s.body, s.bodyErr
}

// formReadsBody reports whether r.ParseForm or r.ParseMultipartForm would read r's body:
// net/http reads an urlencoded body of POST, PUT and PATCH only (parsePostForm, which also
// reads it when a media type parameter is malformed), and a multipart/form-data body of any
// method (multipartReader), each once.
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

// readsJSONBody reports whether httpx.ParseJsonBody decodes r's body: go-zero's withJsonBody
// test, and a body that ParseForm, which runs first, has not consumed.
func readsJSONBody(r *http.Request) bool {
	return r.ContentLength > 0 && strings.Contains(r.Header.Get("Content-Type"), "application/json") &&
		!formReadsBody(r)
}

// parseForm fills s.form as httpx.GetFormValues sees r.Form, by running net/http's own
// ParseForm and ParseMultipartForm on a copy of the request that reads the buffered body; r
// keeps its body and its unparsed form for the handler. An error is one that makes Parse
// fail too.
func (s *httpSource) parseForm() error {
	if s.formDone {
		return s.formErr
	}
	s.formDone = true
	r := s.r
	c := r.WithContext(r.Context()) // a shallow copy: its maps must not be shared with r
	c.Form, c.PostForm = cloneValues(r.Form), cloneValues(r.PostForm)
	if r.Body != nil { // a nil body is "missing form body" for net/http, as for the handler
		c.Body = http.NoBody
		if formReadsBody(r) {
			b, err := s.readBody()
			if err != nil {
				s.formErr = err
				return err
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
		s.formErr = fmt.Errorf("%w: form: %v", flightlock.ErrInvalidKey, err)
		return s.formErr
	}
	s.form, s.postForm = c.Form, c.PostForm
	s.query, _ = url.ParseQuery(r.URL.RawQuery) // ParseForm reported a malformed query
	return nil
}

func cloneValues(v url.Values) url.Values {
	if v == nil {
		return nil
	}
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = slices.Clone(vs)
	}
	return out
}

// formField returns the values of name that go-zero's form binding sees, "name[]" included and
// empty values dropped as GetFormValues does, with the sources that hold them.
func (s *httpSource) formField(name string) (vals []string, inQuery, inBody bool, err error) {
	if err := s.parseForm(); err != nil {
		return nil, false, false, err
	}
	has := func(v url.Values) bool {
		return slices.ContainsFunc(v[name], nonEmpty) || slices.ContainsFunc(v[name+"[]"], nonEmpty)
	}
	for _, k := range [2]string{name, name + "[]"} {
		for _, v := range s.form[k] {
			if v != "" {
				vals = append(vals, v)
			}
		}
	}
	return vals, has(s.query), has(s.postForm), nil
}

func nonEmpty(v string) bool { return v != "" }

// formSources names the parts of the form that hold a value, for messages.
func formSources(inQuery, inBody bool) []string {
	switch {
	case inQuery && inBody:
		return []string{"the query", "the form body"}
	case inQuery:
		return []string{"the query"}
	case inBody:
		return []string{"the form body"}
	}
	return []string{"the form"}
}

// formValue resolves {query.x} (fromQuery) or {form.x}: the value must be in that part of the
// request, and go-zero's form binding, which merges the query with the form body, must see no
// other value.
func (s *httpSource) formValue(ref, name string, fromQuery bool) (string, bool, error) {
	vals, inQuery, inBody, err := s.formField(name)
	if err != nil || (fromQuery && !inQuery) || (!fromQuery && !inBody) {
		return "", false, err
	}
	var c candidates
	c.addFrom(formSources(inQuery, inBody), vals)
	return c.one(ref, "send one value")
}

// jsonObject decodes the body's first JSON value, as ParseJsonBody does, when ParseJsonBody
// would read the body at all.
func (s *httpSource) jsonObject() (map[string]json.RawMessage, error) {
	if s.jsonDone {
		return s.json, s.jsonErr
	}
	s.jsonDone = true
	if !readsJSONBody(s.r) {
		return nil, nil
	}
	b, err := s.readBody()
	if err != nil {
		s.jsonErr = err
		return nil, err
	}
	if len(b) == 0 {
		return nil, nil
	}
	// A body that is one JSON value is decoded in one pass, without a Decoder's copy of it
	// (the body key was a third of the middleware's allocations). Unmarshal refuses
	// data after the first value, which go-zero's decoder ignores: such a body is decoded again
	// as that decoder reads it, the first value only. Either way the result is the one the
	// Decoder alone gave.
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil {
		obj = nil
		if json.NewDecoder(bytes.NewReader(b)).Decode(&obj) != nil {
			obj = nil // not a JSON object: every body field is missing
		}
	}
	s.json = obj
	return s.json, nil
}

// bodyValue follows a dotted path into a JSON body object. Only the objects on the path are
// split into fields, and only the value at its end is decoded: a large body costs a scan, not a
// tree of maps.
func (s *httpSource) bodyValue(path []string) (string, bool, error) {
	obj, err := s.jsonObject()
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

// scalarJSON is the key text of raw, a JSON value that a decoder has already checked (a field
// of a decoded object): what decoding it with UseNumber gives to scalar, without a Decoder: a
// string unescaped, a number as written (json.Number keeps the literal), true or false; no
// text for null, an object or an array.
func scalarJSON(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	switch c := raw[0]; {
	case c == '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case c == '-' || (c >= '0' && c <= '9'):
		if !json.Valid(raw) {
			return "", false
		}
		return string(raw), true
	case c == 't' || c == 'f':
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return "", false
		}
		return strconv.FormatBool(b), true
	}
	return "", false // null, an object or an array
}

// headerValue resolves {header.X}. go-zero binds headers too, and a repeated header with
// different values has no single value to lock.
func (s *httpSource) headerValue(ref, name string) (string, bool, error) {
	var c candidates
	c.add("the header", s.r.Header.Values(name)...)
	return c.one(ref, "send one value")
}

// candidates gathers the distinct values that the sources of one reference give.
type candidates struct {
	vals    []string // distinct, in the order seen
	sources []string // the sources that gave a value, in the order seen
}

func (c *candidates) add(source string, vals ...string) {
	c.addFrom([]string{source}, vals)
}

func (c *candidates) addFrom(sources, vals []string) {
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

// one returns the single value of the reference, or an ErrInvalidKey naming the sources that
// disagree (never their values: the message goes back to the client), with hint.
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

// scalar renders a JSON or JWT claim value: strings, numbers and booleans. Objects, arrays
// and null are not key material.
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

// bindHTTP binds a template reference to its REST getter. route, when known, lets {path.x}
// be checked at start-up. Every value is rendered in its canonical form when it is written as
// a bool or a number (canonicalValue).
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

// canonicalValue returns v in one form for every way of writing the bool or the number that
// httpx.Parse binds from it, and v itself when it writes neither.
//
// go-zero binds a bool field from a path variable, a form value, a header or a JSON string
// (under a ",string" tag) with core/mapping.convertTypeFromString: "1" and every case of
// "true" (strings.EqualFold) are true, "0" and every case of "false" are false; a JSON true
// or false binds the same bools. So "true", "TRUE", "True" and "1" are one bool to the
// handler and render as "1", and "false", "FALSE" and "0" as "0": the numeric form, which an
// integer field's 1 and 0 render too, so that no integer key changes, and a zrpc bool renders
// alike (scalarField). As with numbers, a string field that holds "true" then shares a lock
// with "1": a wait, never a second holder.
func canonicalValue(v string) string {
	switch {
	case strings.EqualFold(v, "true"):
		return "1"
	case strings.EqualFold(v, "false"):
		return "0"
	}
	return canonicalNumber(v)
}

// canonicalNumber returns v in one form for every way of writing its number, and v itself
// when it is not written as a number.
//
// httpx.Parse binds a path variable, a query or form value, a header and a JSON number into an
// integer field with strconv.ParseInt, and into a float field with strconv.ParseFloat: "7",
// "07", "+7" and "007" are all 7 to the handler, "0" and "-0" are 0, and 1, 1.0, 1e0, 0x1p0
// and 1_0e-1 are one float. Keys rendered from the text were different for one entity, and two
// requests on it both held "their" lock. The middleware does not know the handler's
// field types, so every value written as a number is rendered in one form; a string field that
// holds "007" and another that holds "7" then share a lock, which costs a wait, never a second
// holder. (Share rules keep the values as written for their stored responses: replayKeys.)
//
// Integers (an optional sign and decimal digits) are rewritten exactly, at any length, so that
// large ids such as snowflake int64s keep one key each: the sign of zero, a "+" and every
// leading zero go, whatever the value's length (65 zeros before a 7 are a 7). Anything else that ParseFloat reads as a finite number, in the
// characters of Go's float literals, is written as the float64 it reads: its digits when it is
// integral, else Go's shortest form. What stays apart: an integer beyond 2^53 written once as
// an integer and once with a point or exponent, which a float field reads as one float64 (an
// integer field cannot take the second; lock on integer ids, not floats).
func canonicalNumber(v string) string {
	if v == "" {
		return v
	}
	digits := v
	if v[0] == '+' || v[0] == '-' {
		digits = v[1:]
	}
	if isDigits(digits) {
		d := strings.TrimLeft(digits, "0")
		switch {
		case d == "":
			return "0"
		case v[0] == '-':
			return "-" + d
		}
		return d
	}
	if !floatLiteral(v) {
		return nonFinite(v)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return v
	}
	if f == 0 {
		return "0"
	}
	if f == math.Trunc(f) {
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// isDigits reports whether s is one or more decimal digits.
func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// nonFinite returns the one form of an infinity or NaN that ParseFloat reads from v ("Inf",
// "-Inf", "NaN"), and v itself when v is no such word. ParseFloat, with which go-zero binds a
// float field, reads "inf" and "infinity" in any case, with an optional sign, and "nan" in any
// case: "Inf", "+inf" and "INFINITY" are one float to the handler. Every NaN binds as the same
// NaN, so they share one key too. (A literal whose value overflows, such as "1e400", is not
// read by ParseFloat without an error, and go-zero refuses it: it stays as written.)
func nonFinite(v string) string {
	// Only a word of at most 9 bytes ("+infinity") that starts, after a sign, with i or n can
	// be one: anything else is left before ParseFloat, whose error would cost an allocation.
	w := strings.TrimLeft(v, "+-")
	if len(v) > len("+infinity") || w == "" || !strings.ContainsRune("iInN", rune(w[0])) {
		return v
	}
	f, err := strconv.ParseFloat(v, 64)
	switch {
	case err != nil:
		return v
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsInf(f, 1):
		return "Inf"
	}
	return v // not reached: every other text ParseFloat reads is a float literal
}

// floatLiteral reports whether s has a decimal digit and only the characters of Go's float
// literals (ParseFloat's syntax: signs, digits, hexadecimal digits, '.', '_', and the x, e and
// p markers); infinities and NaN are words, left to nonFinite.
func floatLiteral(s string) bool {
	digit := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'f', c >= 'A' && c <= 'F', c == '.', c == '_', c == '+', c == '-',
			c == 'x', c == 'X', c == 'p', c == 'P':
		default:
			return false
		}
	}
	return digit
}

// httpGetter is the REST getter of one template reference, as the request gives the value.
func httpGetter(route *Route, ref string) (getter[*httpSource], error) {
	src, name, dotted := strings.Cut(ref, ".")
	if !dotted {
		return defaultGetter(ref), nil
	}
	switch src {
	case "path":
		if route != nil && !route.Has(name) {
			return nil, fmt.Errorf("{%s}: route %s has no :%s", ref, route.Text, name)
		}
		return func(s *httpSource) (string, bool, error) {
			v := pathvar.Vars(s.r)[name]
			return v, v != "", nil
		}, nil
	case "query":
		return func(s *httpSource) (string, bool, error) { return s.formValue(ref, name, true) }, nil
	case "form":
		return func(s *httpSource) (string, bool, error) { return s.formValue(ref, name, false) }, nil
	case "body":
		path := strings.Split(name, ".")
		return func(s *httpSource) (string, bool, error) { return s.bodyValue(path) }, nil
	case "header":
		return func(s *httpSource) (string, bool, error) { return s.headerValue(ref, name) }, nil
	case "jwt":
		// go-zero's JWT handler stores each custom claim under its name as a plain
		// string context key (rest/handler/authhandler.go); standard claims are not kept.
		return func(s *httpSource) (string, bool, error) {
			v, ok := scalar(s.r.Context().Value(name))
			return v, ok && v != "", nil
		}, nil
	}
	return nil, fmt.Errorf("unknown source %q in {%s} (path, query, form, body, header or jwt)", src, ref)
}

// defaultGetter resolves a bare name from every source that httpx.Parse could bind a field of
// that name from, in the order Parse binds them: the path variable, the form (the query and
// an urlencoded or multipart body), the header of that name, and a top-level field of a JSON
// body that Parse decodes. One value, however many sources give it, is the key; different
// values are refused, since the handler's struct decides which of them it ends with.
func defaultGetter(name string) getter[*httpSource] {
	path := []string{name}
	hint := fmt.Sprintf("send one value, or name the source the handler binds, such as {path.%[1]s}, {query.%[1]s}, {form.%[1]s}, {header.%[1]s} or {body.%[1]s}", name)
	return func(s *httpSource) (string, bool, error) {
		var c candidates
		if v := pathvar.Vars(s.r)[name]; v != "" {
			c.add("the path variable", v)
		}
		vals, inQuery, inBody, err := s.formField(name)
		if err != nil {
			return "", false, err
		}
		c.addFrom(formSources(inQuery, inBody), vals)
		c.add("the header", s.r.Header.Values(name)...)
		v, ok, err := s.bodyValue(path)
		if err != nil {
			return "", false, err
		}
		if ok {
			c.add("the JSON body", v) // "" too: Parse binds it over the form's value
		}
		return c.one(name, hint)
	}
}

// httpKeys computes the keys of one REST request for a rule.
type httpKeys func(r *http.Request) ([]string, error)

func templateHTTPKeys(plan keyPlan[*httpSource]) httpKeys {
	return func(r *http.Request) ([]string, error) {
		return plan.render(&httpSource{r: r})
	}
}

// templateHTTPRawKeys renders plan's keys with the values as the request wrote them. A share
// rule stores and replays responses under them: numbers written two ways ("007", "7") share a
// lock, a wait, but never a stored response, which a handler reading a string field would
// give to the wrong entity.
func templateHTTPRawKeys(plan keyPlan[*httpSource]) httpKeys {
	return func(r *http.Request) ([]string, error) {
		return plan.render(&httpSource{r: r, raw: true})
	}
}

func funcHTTPKeys(fn KeyFunc) httpKeys {
	return func(r *http.Request) ([]string, error) {
		return userKey(fn(r))
	}
}

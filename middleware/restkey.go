package middleware

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/rest/pathvar"
)

// KeyFunc computes the lock key of a REST request in Go, for WithHTTPRule and RouteFunc. An error or
// an empty key answers 400 without running the handler; the error need not wrap
// flightlock.ErrInvalidKey. The key is used as is: escape user input so that different
// requests cannot forge each other's key.
type KeyFunc func(r *http.Request) (string, error)

// maxBodyBytes bounds the request body that a template reads for {form.x} and {body.x}:
// a larger body answers 400 (before go-zero's MaxBytes, which is 1 MiB by default, too).
const maxBodyBytes = 1 << 20

// httpSource is one request as seen by the key getters. The body, query, form and JSON are
// read once, on first use.
type httpSource struct {
	r *http.Request

	query    url.Values
	body     []byte
	bodyErr  error
	bodyRead bool
	form     url.Values
	formDone bool
	json     map[string]json.RawMessage // the body's top-level fields, undecoded; nil if not an object
	jsonDone bool
}

// readBody reads the body up to maxBodyBytes and puts it back, so that the handler's
// httpx.Parse reads it again.
func (s *httpSource) readBody() ([]byte, error) {
	if s.bodyRead {
		return s.body, s.bodyErr
	}
	s.bodyRead = true
	if s.r.Body == nil || s.r.Body == http.NoBody {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(s.r.Body, maxBodyBytes+1))
	_ = s.r.Body.Close()
	// Whatever happened, the handler gets what was read: nothing is lost for it.
	s.r.Body = io.NopCloser(bytes.NewReader(b))
	switch {
	case err != nil:
		s.bodyErr = fmt.Errorf("%w: read request body: %v", flightlock.ErrInvalidKey, err)
	case len(b) > maxBodyBytes:
		s.bodyErr = fmt.Errorf("%w: request body over %d bytes", flightlock.ErrInvalidKey, maxBodyBytes)
	}
	s.body = b
	return s.body, s.bodyErr
}

func (s *httpSource) mediaType() string {
	mt, _, _ := mime.ParseMediaType(s.r.Header.Get("Content-Type"))
	return mt
}

func (s *httpSource) queryValue(name string) (string, bool, error) {
	if s.query == nil {
		s.query = s.r.URL.Query()
	}
	v := s.query.Get(name)
	return v, v != "", nil
}

func (s *httpSource) formValue(name string) (string, bool, error) {
	if !s.formDone {
		s.formDone = true
		switch s.mediaType() {
		case "application/x-www-form-urlencoded":
			b, err := s.readBody()
			if err != nil {
				return "", false, err
			}
			// A malformed pair leaves the others readable, as in net/http.
			s.form, _ = url.ParseQuery(string(b))
		case "multipart/form-data":
			b, err := s.readBody()
			if err != nil {
				return "", false, err
			}
			s.form = s.multipartValues(b)
		}
	}
	v := s.form.Get(name)
	return v, v != "", nil
}

// multipartValues returns the text fields of a multipart body; files are skipped.
func (s *httpSource) multipartValues(b []byte) url.Values {
	_, params, err := mime.ParseMediaType(s.r.Header.Get("Content-Type"))
	if err != nil || params["boundary"] == "" {
		return nil
	}
	form, err := multipart.NewReader(bytes.NewReader(b), params["boundary"]).ReadForm(maxBodyBytes)
	if err != nil {
		return nil
	}
	defer func() { _ = form.RemoveAll() }()
	return url.Values(form.Value)
}

// bodyValue follows a dotted path into a JSON body object. Only the objects on the path are
// split into fields, and only the value at its end is decoded: a large body costs a scan, not a
// tree of maps.
func (s *httpSource) bodyValue(path []string) (string, bool, error) {
	if !s.jsonDone {
		s.jsonDone = true
		switch s.mediaType() {
		case "application/x-www-form-urlencoded", "multipart/form-data":
		default:
			b, err := s.readBody()
			if err != nil {
				return "", false, err
			}
			if len(b) > 0 && json.Unmarshal(b, &s.json) != nil {
				s.json = nil // not a JSON object: every body field is missing
			}
		}
	}
	obj := s.json
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
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return "", false, nil
	}
	str, ok := scalar(v)
	return str, ok, nil
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
// be checked at start-up.
func bindHTTP(route *routePattern) func(ref string) (getter[*httpSource], error) {
	return func(ref string) (getter[*httpSource], error) {
		src, name, dotted := strings.Cut(ref, ".")
		if !dotted {
			return defaultGetter(ref), nil
		}
		switch src {
		case "path":
			if route != nil && !route.has(name) {
				return nil, fmt.Errorf("{%s}: route %s has no :%s", ref, route.text, name)
			}
			return func(s *httpSource) (string, bool, error) {
				v := pathvar.Vars(s.r)[name]
				return v, v != "", nil
			}, nil
		case "query":
			return func(s *httpSource) (string, bool, error) { return s.queryValue(name) }, nil
		case "form":
			return func(s *httpSource) (string, bool, error) { return s.formValue(name) }, nil
		case "body":
			path := strings.Split(name, ".")
			return func(s *httpSource) (string, bool, error) { return s.bodyValue(path) }, nil
		case "header":
			return func(s *httpSource) (string, bool, error) {
				v := s.r.Header.Get(name)
				return v, v != "", nil
			}, nil
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
}

// defaultGetter looks a bare name up as a path variable, a query parameter, a form field and a
// top-level JSON body field, in that order.
func defaultGetter(name string) getter[*httpSource] {
	path := []string{name}
	return func(s *httpSource) (string, bool, error) {
		if v := pathvar.Vars(s.r)[name]; v != "" {
			return v, true, nil
		}
		if v, ok, _ := s.queryValue(name); ok {
			return v, true, nil
		}
		if s.r.Body == nil || s.r.Body == http.NoBody {
			return "", false, nil
		}
		if v, ok, err := s.formValue(name); ok || err != nil {
			return v, ok, err
		}
		return s.bodyValue(path)
	}
}

// httpKeys computes the keys of one REST request for a rule.
type httpKeys func(r *http.Request) ([]string, error)

func templateHTTPKeys(plan keyPlan[*httpSource]) httpKeys {
	return func(r *http.Request) ([]string, error) {
		return plan.render(&httpSource{r: r})
	}
}

func funcHTTPKeys(fn KeyFunc) httpKeys {
	return func(r *http.Request) ([]string, error) {
		return userKey(fn(r))
	}
}

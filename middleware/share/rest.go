package share

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net/http"

	"github.com/flightlock/flightlock/middleware/internal/sharehook"
	"github.com/flightlock/flightlock/middleware/rules"
)

// unshared headers belong to one response and are never replayed: a cookie is its client's,
// and the others describe the transfer, not the content.
var unshared = []string{"Set-Cookie", "Content-Length", "Date", "Connection", "Transfer-Encoding", "Trailer"}

func shareable(h http.Header) http.Header {
	c := h.Clone()
	for _, k := range unshared {
		c.Del(k)
	}
	return c
}

// HandleHTTP is the REST middleware's work for a share rule: the status, headers and body of
// the request that ran the handler.
func (rl *rule) HandleHTTP(w http.ResponseWriter, r *http.Request, next http.HandlerFunc, keys []string) {
	ctx := r.Context()
	// The fingerprint's body, as the keys read it (go-zero's MaxBytes misses a chunked body).
	body, err := rules.ReadBody(r)
	replayKeys := keys // the lock's keys; a template's values as written, when it has some
	if err == nil && rl.plan.HTTPReplayKeys != nil {
		replayKeys, err = rl.plan.HTTPReplayKeys(r)
	}
	if err != nil {
		rl.g.conf.HTTPError(w, r, err)
		return
	}
	print := fingerprint([]byte(r.Method), []byte(r.URL.Path), []byte(r.URL.RawQuery), body)
	rec, err := rl.share(ctx, keys, replayKeys, print, func(ctx context.Context, fence int64) (*record, bool, error) {
		rr := &recorder{header: http.Header{}, status: http.StatusOK}
		r := r.WithContext(ctx)
		r.Body = io.NopCloser(bytes.NewReader(body))
		next(rr, r)
		rec := &record{Status: rr.status, Header: shareable(rr.header), Body: rr.body.Bytes(), Fence: fence,
			Print: print, own: rr.header, silent: !rr.wrote}
		return rec, rec.Status >= 100 && rec.Status < 600 && rl.classes[rec.Status/100], nil
	})
	var pe *panicError
	switch {
	case errors.As(err, &pe):
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	case err != nil: // ErrPayloadMismatch among them: 422
		rl.g.conf.HTTPError(w, r, err)
		return
	}
	header := rec.Header
	if !rec.replayed && rec.own != nil {
		header = rec.own // the request that ran the handler answers with all of its headers
	}
	maps.Copy(w.Header(), header)
	if rec.replayed {
		w.Header().Set(sharehook.ReplayedHeader, "true")
	}
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

// recorder captures a handler's response for sharing.
type recorder struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wrote && status >= 200 { // an informational 1xx comes before the answer
		r.status, r.wrote = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}

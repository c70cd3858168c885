package middleware

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
)

// Gateway is a rest.Middleware for go-zero's gateway, which serves zrpc methods as REST routes:
//
//	gw := gateway.MustNewServer(c, gateway.WithMiddleware(flmw.Gateway))
//
// The gateway answers a busy lock of the service behind it with 409 (codes.Aborted), and copies
// the call's trailers into response headers as they are. The status details, which carry the
// busy answer's RetryInfo, are binary (grpc-status-details-bin), and a header of raw bytes is
// one that Go's net/http client, and other strict clients, refuse: the whole response is lost,
// not only the hint. Gateway turns the RetryInfo into Retry-After (whole seconds, rounded up)
// and writes every binary header in base64, as gRPC sends them, before the response goes out.
func Gateway(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		next(&gatewayWriter{ResponseWriter: w}, r)
	}
}

// gatewayTrailerPrefix is how go-zero's gateway names a trailer of the call in the response.
const gatewayTrailerPrefix = "Grpc-Trailer-"

// gatewayWriter fixes the headers once, just before they are written.
type gatewayWriter struct {
	http.ResponseWriter
	once sync.Once
}

func (w *gatewayWriter) WriteHeader(code int) {
	w.once.Do(w.fixHeaders)
	w.ResponseWriter.WriteHeader(code)
}

func (w *gatewayWriter) Write(b []byte) (int, error) {
	w.once.Do(w.fixHeaders)
	return w.ResponseWriter.Write(b)
}

func (w *gatewayWriter) Flush() {
	w.once.Do(w.fixHeaders)
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (w *gatewayWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *gatewayWriter) fixHeaders() {
	h := w.Header()
	if d, ok := detailsRetryDelay(h.Get(gatewayTrailerPrefix + "Grpc-Status-Details-Bin")); ok && h.Get("Retry-After") == "" {
		h.Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
	}
	for k, vs := range h {
		if !strings.HasSuffix(k, "-Bin") {
			continue
		}
		for i, v := range vs {
			vs[i] = base64.StdEncoding.EncodeToString([]byte(v))
		}
	}
}

// detailsRetryDelay reads the RetryInfo out of raw grpc-status-details-bin bytes.
func detailsRetryDelay(raw string) (time.Duration, bool) {
	if raw == "" {
		return 0, false
	}
	var st spb.Status
	if proto.Unmarshal([]byte(raw), &st) != nil {
		return 0, false
	}
	for _, d := range st.GetDetails() {
		var ri errdetails.RetryInfo
		if d.MessageIs(&ri) && d.UnmarshalTo(&ri) == nil {
			if delay := ri.GetRetryDelay().AsDuration(); delay > 0 {
				return delay, true
			}
		}
	}
	return 0, false
}

package middleware

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/zeromicro/go-zero/rest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Gateway is a rest.Middleware for go-zero's gateway (gateway.WithMiddleware(flmw.Gateway)),
// which serves zrpc methods as REST routes. The gateway copies the call's trailers into
// response headers as they are, and strict clients (Go's net/http) refuse a header of raw
// bytes such as grpc-status-details-bin, losing the response. Gateway turns the busy answer's
// RetryInfo into Retry-After and writes every binary header in base64, as gRPC sends them.
func Gateway(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		next(&gatewayWriter{ResponseWriter: w}, r)
	}
}

// gatewayTrailerPrefix is how go-zero's gateway names a trailer of the call in the response.
const gatewayTrailerPrefix = "Grpc-Trailer-"

// gatewayWriter fixes the headers once, before they are written.
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
		h.Set("Retry-After", wholeSeconds(d))
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
	var st spb.Status
	if raw == "" || proto.Unmarshal([]byte(raw), &st) != nil {
		return 0, false
	}
	for _, d := range status.FromProto(&st).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// GatewayRoutes lists the REST routes of the Mappings of go-zero's gateway config c (a
// gateway.GatewayConf or a pointer to one), which the gateway adds in Start, so that
// lock.MustCheckRoutes(flmw.GatewayRoutes(c)) can run before gw.Start(); not those of
// google.api.http annotations. c is read by field name through encoding/json, so that services
// do not link the gateway package and its gRPC reflection; anything else gives no routes.
func GatewayRoutes(c any) []rest.Route {
	var gc struct {
		Upstreams []struct {
			Mappings []struct{ Method, Path string }
		}
	}
	if b, err := json.Marshal(c); err != nil || json.Unmarshal(b, &gc) != nil {
		return nil
	}
	var routes []rest.Route
	for _, up := range gc.Upstreams {
		for _, m := range up.Mappings {
			routes = append(routes, rest.Route{Method: strings.ToUpper(m.Method), Path: m.Path})
		}
	}
	return routes
}

package httpbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/zeromicro/go-zero/core/logc"
	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"
)

// ErrBusy is what a LockFunc returns when the key is taken, whatever its library says.
var ErrBusy = errors.New("busy")

// LockFunc takes key without waiting, for the TTL of its own lock; it returns the release, or
// ErrBusy when the key is taken.
type LockFunc func(ctx context.Context, key string) (release func(context.Context) error, err error)

// OrderMiddleware locks POST /api/order/create on prefix + "order:{uid}" with lock, as a
// go-zero user would write it without flightlock: the uid from the JSON body (restored for the
// handler's httpx.Parse), the lock (409 when busy, 503 when the store fails), the handler, the
// release. Every other route passes through. Install it with app.WithOrderLock.
func OrderMiddleware(lock LockFunc, prefix string) rest.Middleware {
	return func(next http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost || r.URL.Path != "/api/order/create" {
				next(w, r)
				return
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				httpx.ErrorCtx(r.Context(), w, err)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var req struct {
				UID string `json:"uid"`
			}
			if err := json.Unmarshal(body, &req); err != nil || req.UID == "" {
				httpx.ErrorCtx(r.Context(), w, errors.New("uid is required"))
				return
			}
			release, err := lock(r.Context(), prefix+"order:"+req.UID)
			switch {
			case errors.Is(err, ErrBusy):
				http.Error(w, "lock busy", http.StatusConflict)
				return
			case err != nil:
				http.Error(w, "lock store unavailable", http.StatusServiceUnavailable)
				return
			}
			defer func() {
				if err := release(context.WithoutCancel(r.Context())); err != nil {
					logc.Errorf(r.Context(), "order lock: release: %v", err)
				}
			}()
			next(w, r)
		}
	}
}

package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/flightlock/flightlock/middleware"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/rest"
)

// A duplicate create-order request for a user is answered 409 while the first one runs.
func ExampleMiddleware_Handle() {
	logx.Disable()
	lock := middleware.MustNew(middleware.LockConf{ // no Redis host: the embedded store
		Rules: []middleware.Rule{{Method: http.MethodPost, Path: "/api/order/:uid", Key: "order:{uid}"}},
	})
	defer lock.Close()

	server := rest.MustNewServer(rest.RestConf{Timeout: 3000})
	server.Use(lock.Handle)
	var h http.Handler
	server.AddRoute(rest.Route{Method: http.MethodPost, Path: "/api/order/:uid",
		Handler: func(w http.ResponseWriter, r *http.Request) {
			// A second request for the same user while this one holds the lock:
			dup := httptest.NewRecorder()
			h.ServeHTTP(dup, httptest.NewRequest(http.MethodPost, "/api/order/42", nil))
			fmt.Println("duplicate:", dup.Code, "Retry-After set:", dup.Header().Get("Retry-After") != "")
		}})
	s, err := rest.NewServerless(server)
	if err != nil {
		panic(err)
	}
	h = http.HandlerFunc(s.Serve)

	first := httptest.NewRecorder()
	h.ServeHTTP(first, httptest.NewRequest(http.MethodPost, "/api/order/42", nil))
	fmt.Println("first:", first.Code)
	// Output:
	// duplicate: 409 Retry-After set: true
	// first: 200
}

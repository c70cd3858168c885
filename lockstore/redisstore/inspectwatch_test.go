package redisstore

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/redistest"
	"github.com/flightlock/flightlock/lockstore"
)

// A watch waits for Redis to confirm its subscription no longer than its context and
// opts.Timeout allow: on a link that lost the PSUBSCRIBE (a server that never answers it), an
// operator's interrupt ends the watch with nil, and with no interrupt the watch fails after
// opts.Timeout, as any of its reads would. go-redis's Receive heeds a context's deadline only;
// a cancelled context has none.
func TestInspectorWatchBoundsTheWaitForItsConfirmation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		cancel  bool // cancel once the PSUBSCRIBE is lost
	}{
		{name: "interrupted", timeout: time.Hour, cancel: true},
		{name: "unanswered", timeout: 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			lost := make(chan struct{})
			var once sync.Once
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, DisableIdentity: true,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return &losingConn{Conn: c, lose: []byte("psubscribe"), lost: func() { once.Do(func() { close(lost) }) }}, nil
				}})
			t.Cleanup(func() { _ = client.Close() })
			in := NewInspector(client, "")

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- in.Watch(ctx, "*", lockstore.WatchOptions{Timeout: tc.timeout}, func(lockstore.Event) {})
			}()
			<-lost
			if tc.cancel {
				cancel()
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("a watch whose subscription is never confirmed did not return")
			}
			var timeout net.Error // context.DeadlineExceeded, or the read's i/o timeout at the same moment
			if want := !tc.cancel; (err != nil) != want || want && !(errors.As(err, &timeout) && timeout.Timeout()) {
				t.Fatalf("watch returned %v; want nil when interrupted, a deadline error after opts.Timeout", err)
			}
		})
	}
}

// losingConn drops every write that contains lose, as a link that loses it: the server never
// sees the command and never answers it.
type losingConn struct {
	net.Conn
	lose []byte
	lost func()
}

func (c *losingConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.lose) {
		c.lost()
		return len(b), nil
	}
	return c.Conn.Write(b)
}

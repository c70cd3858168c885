// Package httpbench is what the HTTP scenarios of lockbench share, on every store:
// the example system (example/app) started in the benchmark process on free loopback ports
// and loaded with wrk (order.lua); a plain go-zero middleware around another library's lock,
// for the rows that replace the example's own; and the server and bursts of the duplicates
// scenario (one request sent many times at once, OnBusy share against reject).
package httpbench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/zeromicro/go-zero/core/proc"
	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock/example/app"
	"github.com/flightlock/flightlock/internal/testenv/freeport"
	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/share"
)

// Seeded state of every uid: enough stock and money for more orders than a run makes, so a
// uid reused after a wrap still succeeds.
const (
	seedStock   = 1_000_000
	seedBalance = 1_000_000_000 // cents
)

// Load reads the example's config file and points its three services at free loopback ports,
// with what every row of an HTTP scenario shares: no order delay, load shedding off (on 2 busy
// cores it would answer 503s at saturation; dev mode turns it off too) and logs at level severe
// (a log line per request would measure the terminal; go-zero still formats it, its log
// handler builds the line before the level check, in every row alike). The caller points the
// stores (Redis, etcd) and passes the ports to Start.
func Load(path string) (app.Config, []int, error) {
	c, err := app.LoadConfig(path)
	if err != nil {
		return app.Config{}, nil, err
	}
	ports, err := freeport.Ports(3)
	if err != nil {
		return app.Config{}, nil, err
	}
	c.Order.Host, c.Order.Port = "127.0.0.1", ports[0]
	c.Inventory.ListenOn = fmt.Sprintf("127.0.0.1:%d", ports[1])
	c.Balance.ListenOn = fmt.Sprintf("127.0.0.1:%d", ports[2])
	c.Order.Inventory.Endpoints = []string{c.Inventory.ListenOn}
	c.Order.Balance.Endpoints = []string{c.Balance.ListenOn}
	c.Order.OrderDelay = 0
	c.Order.CpuThreshold, c.Inventory.CpuThreshold, c.Balance.CpuThreshold = 0, 0, 0
	c.Order.Log.Level, c.Inventory.Log.Level, c.Balance.Log.Level = "severe", "severe", "severe"
	return c, ports, nil
}

// System is one row's running example.
type System struct {
	ID     string // the row
	Prefix string // starts the uids of the row's requests, distinct per row
	URL    string // the order API
	Sys    *app.System
	// RPS is the requests/s the row last reached at saturation (or in its warm-up): it sizes
	// the uids seeded for the next run.
	RPS float64

	next   int64 // next uid index
	done   chan struct{}
	closes []func()
}

// Start builds the example from c (Load's config, its stores pointed by the caller) with opts,
// starts its three servers in the background and waits until they listen on ports. closes run
// after the servers stop (Stop), e.g. to close a client the row's own middleware uses.
func Start(id, prefix string, c app.Config, ports []int, closes []func(), opts ...app.Option) (*System, error) {
	sys, err := app.New(c, opts...)
	if err != nil {
		for _, f := range closes {
			f()
		}
		return nil, err
	}
	return launch(&System{ID: id, Prefix: prefix, Sys: sys, closes: closes}, sys.Start, ports)
}

// launch runs serve, which serves s, in the background and waits until something listens on
// each of ports, the first of them s's order API; if one does not, Stop of the other systems
// shuts s down with them.
func launch(s *System, serve func(), ports []int) (*System, error) {
	s.URL, s.done = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), make(chan struct{})
	go func() {
		defer close(s.done)
		serve()
	}()
	for _, p := range ports {
		if err := WaitListening(p); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Stop stops every go-zero server of the process, then closes the systems; logf reports what
// did not go well. go-zero's servers, the example's and bare ones alike, stop through the
// process's shutdown listeners (proc.Shutdown, as app.System.Stop calls it): their Stop
// methods only close the logs. One call stops every server started since the last one.
func Stop(systems []*System, logf func(format string, args ...any)) {
	if len(systems) == 0 {
		return
	}
	proc.Shutdown()
	for _, s := range systems {
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			logf("%s: the servers did not stop within 10s", s.ID)
		}
		if s.Sys != nil {
			if err := s.Sys.Close(); err != nil {
				logf("%s: close: %v", s.ID, err)
			}
		}
		for _, f := range s.closes {
			f()
		}
	}
}

// seed creates count uids from the next one (each with a SKU of the same name), with enough
// stock and money, and returns the first.
func (s *System) seed(count int64) (int64, error) {
	first := s.next
	if s.Sys == nil {
		return first, nil // a bare server reads no state
	}
	stock, money := make(map[string]int64, count), make(map[string]int64, count)
	for i := first; i < first+count; i++ {
		uid := s.Prefix + strconv.FormatInt(i, 10) // also the name of the SKU it orders
		stock[uid], money[uid] = seedStock, seedBalance
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Sys.Seed(ctx, stock, money); err != nil {
		return 0, fmt.Errorf("%s: seed: %w", s.ID, err)
	}
	return first, nil
}

// PointRedis points the example's Redis at addr (a node), and every service's Lock section
// that carries its own copy of it (the example refuses one that differs from the top-level).
func PointRedis(c *app.Config, addr string) {
	c.Redis.Host, c.Redis.Type = addr, "node"
	for _, rc := range []*flmw.RedisConf{&c.Order.Lock.Redis, &c.Inventory.Lock.Redis, &c.Balance.Lock.Redis} {
		if rc.Host != "" {
			rc.Host, rc.Type = addr, "node"
		}
	}
}

// OrderRules builds a middleware of the order API's rules lc with edit applied to the
// create-order rule, for app.WithOrderLock in a row of its own; close it once the system has
// stopped. The example's order logic fences its writes with the lease of the lock it expects
// (a Redis rule's, enforced); installed this way, a request without it writes unfenced, as in
// the rows of the other libraries.
func OrderRules(lc flmw.LockConf, edit func(*flmw.Rule), opts ...flmw.Option) (mw rest.Middleware, closeMW func(), err error) {
	// The order API's rules hold an OnBusy share rule: sharing is linked as the example's
	// main.go and app.New link it, whether or not a system was built before this middleware.
	flmw.ResponseSharing = share.New
	lc.Rules = slices.Clone(lc.Rules)
	i := slices.IndexFunc(lc.Rules, func(r flmw.Rule) bool { return r.Path == "/api/order/create" })
	if i < 0 {
		return nil, nil, errors.New("the order API has no rule for /api/order/create")
	}
	edit(&lc.Rules[i])
	m, err := flmw.New(lc, opts...)
	if err != nil {
		return nil, nil, err
	}
	return m.Handle, func() { _ = m.Close() }, nil
}

// WaitListening waits up to 10s for something to accept connections on the loopback port.
func WaitListening(port int) error {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for range 400 { // 400 x 25ms: 10s
		if conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			_ = conn.Close()
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

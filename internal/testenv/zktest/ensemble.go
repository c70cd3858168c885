package zktest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/freeport"
)

// Ensemble is a ZooKeeper ensemble that one test started. Its servers end when the test ends.
//
// Each server reaches each other one through links of the ensemble's own (a quorum link and an
// election link per direction), named in its zoo.cfg in place of the peer's ports, so that
// Isolate can cut a server off from the others while its client port stays reachable.
type Ensemble struct {
	Servers []*Server // Servers[i].ID is i+1

	tb    testing.TB
	links map[[2]int][]*link // {from ID, to ID}: the links that server from dials to reach to
}

// StartEnsemble runs n fresh ZooKeeper servers on free loopback ports as one ensemble, waits
// until one leads and every other follows it, and kills them when tb ends. Three is the usual
// size: the smallest that keeps a quorum when one server is killed or isolated.
func StartEnsemble(tb testing.TB, n int, opts ...Option) *Ensemble {
	tb.Helper()
	if n < 2 {
		tb.Fatalf("zktest: an ensemble needs at least two servers, got %d (Start runs one)", n)
	}
	cfg := newConfig(opts)
	java, cp := installation(tb)
	root := tb.TempDir()
	e := &Ensemble{tb: tb, links: map[[2]int][]*link{}}
	quorum := make([]string, n+1) // by ID: the real quorum and election ports
	election := make([]string, n+1)
	for id := 1; id <= n; id++ {
		dir := filepath.Join(root, fmt.Sprintf("zk%d", id))
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
			tb.Fatal(err)
		}
		e.Servers = append(e.Servers, &Server{
			Addr: freeport.Addr(tb), ID: id, tb: tb, java: java, classpath: cp,
			conf: filepath.Join(dir, "zoo.cfg"), log: filepath.Join(dir, "zookeeper.log"),
		})
		quorum[id], election[id] = freeport.Addr(tb), freeport.Addr(tb)
	}
	var all []*link
	patience := time.Duration(cfg.initLimit) * cfg.tick
	for from := 1; from <= n; from++ {
		for to := 1; to <= n; to++ {
			if from == to {
				continue
			}
			q, err := newLink(quorum[to], patience)
			if err != nil {
				tb.Fatalf("zktest: link: %v", err)
			}
			el, err := newLink(election[to], patience)
			if err != nil {
				tb.Fatalf("zktest: link: %v", err)
			}
			e.links[[2]int{from, to}] = []*link{q, el}
			all = append(all, q, el)
		}
	}
	tb.Cleanup(func() {
		for _, l := range all {
			l.close()
		}
	})
	for key, ls := range e.links {
		ls[1].advertise = e.links[[2]int{key[1], key[0]}][1].addr
	}
	for _, l := range all {
		l.start() // after advertise is set: the links' goroutines read it
	}

	for _, s := range e.Servers {
		var body strings.Builder
		body.WriteString(cfg.lines(filepath.Join(filepath.Dir(s.conf), "data")))
		for _, peer := range e.Servers {
			q, el := quorum[peer.ID], election[peer.ID]
			if peer != s {
				ls := e.links[[2]int{s.ID, peer.ID}]
				q, el = ls[0].addr, ls[1].addr
			}
			// All on loopback: server.N=host:quorum port:election port;client address.
			fmt.Fprintf(&body, "server.%d=127.0.0.1:%s:%s;%s\n", peer.ID, port(q), port(el), peer.Addr)
		}
		if err := os.WriteFile(s.conf, []byte(body.String()), 0o600); err != nil {
			tb.Fatal(err)
		}
		myid := filepath.Join(filepath.Dir(s.conf), "data", "myid")
		if err := os.WriteFile(myid, []byte(fmt.Sprintln(s.ID)), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	for _, s := range e.Servers {
		tb.Cleanup(s.Stop)
		s.start()
	}
	e.WaitReady(readyTimeout)
	return e
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// Addrs returns the client addresses of every server, for a client of the whole ensemble.
func (e *Ensemble) Addrs() []string {
	addrs := make([]string, len(e.Servers))
	for i, s := range e.Servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// WaitReady waits until exactly one running server leads and every other running server that
// is not isolated follows, failing the test after within.
func (e *Ensemble) WaitReady(within time.Duration) {
	e.tb.Helper()
	e.awaitReady(within)
}

// awaitReady is WaitReady; it returns the followers of the reading that found the ensemble
// ready, in ID order.
func (e *Ensemble) awaitReady(within time.Duration) []*Server {
	e.tb.Helper()
	deadline := time.Now().Add(within)
	for {
		followers, err := e.ready()
		if err == nil {
			return followers
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, s := range e.Servers {
				fmt.Fprintf(&logs, "--- %s ---\n%s\n", s, s.tail())
			}
			e.tb.Fatalf("zktest: ensemble not ready after %v: %v\n%s", within, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ready returns the followers when exactly one running server that is not isolated leads and
// every other one follows.
func (e *Ensemble) ready() ([]*Server, error) {
	leaders := 0
	var followers []*Server
	for _, s := range e.Servers {
		if s.Pid() == 0 || e.isolated(s) {
			continue
		}
		switch m := s.Mode(); m {
		case ModeLeader:
			leaders++
		case ModeFollower:
			followers = append(followers, s)
		default:
			return nil, fmt.Errorf("%s reports mode %q", s, m)
		}
	}
	if leaders != 1 {
		return nil, fmt.Errorf("%d servers lead", leaders)
	}
	return followers, nil
}

// Leader returns the server that leads, asking each running server that is not isolated with
// srvr, and waiting until exactly one says it leads: after the leader is killed or isolated,
// until the others have elected another. (An isolated old leader may still say it leads until
// its own timeout; it is not asked.) It fails the test when no single leader emerges within a
// generous bound.
func (e *Ensemble) Leader() *Server {
	e.tb.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		var leaders []*Server
		for _, s := range e.Servers {
			if s.Pid() != 0 && !e.isolated(s) && s.Mode() == ModeLeader {
				leaders = append(leaders, s)
			}
		}
		if len(leaders) == 1 {
			return leaders[0]
		}
		if time.Now().After(deadline) {
			e.tb.Fatalf("zktest: %d servers lead after %v: %v", len(leaders), readyTimeout, leaders)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Followers waits until the ensemble is ready, as WaitReady does (failing the test after a
// generous bound), and returns the running servers, not isolated, that follow, in ID order. A
// single round of asking could miss a follower too busy to answer within Mode's second, or ask
// in the middle of an election.
func (e *Ensemble) Followers() []*Server {
	e.tb.Helper()
	return e.awaitReady(readyTimeout)
}

// Isolate cuts s off from every other server of the ensemble, in both directions, as a network
// partition would: the quorum and election connections between them stay open and carry
// nothing, and new ones never reach the other side. s's client port is not touched, so s keeps
// answering its clients until its own timeouts take it out of the quorum (a follower that hears
// nothing from its leader for syncLimit ticks, a leader that hears from no quorum of followers
// for syncLimit ticks); from then on it answers ModeNotServing while it looks for a leader it
// cannot reach. The others keep or elect a leader among themselves if they are a majority.
func (e *Ensemble) Isolate(s *Server) { e.setCut(s, true) }

// Heal undoes Isolate: the connections held during the partition are closed and new ones reach
// the peers again, so s rejoins the ensemble by its own reconnection (WaitReady waits for it).
func (e *Ensemble) Heal(s *Server) { e.setCut(s, false) }

func (e *Ensemble) setCut(s *Server, cut bool) {
	for key, ls := range e.links {
		if key[0] == s.ID || key[1] == s.ID {
			for _, l := range ls {
				l.setCut(cut)
			}
		}
	}
}

// isolated reports whether s is cut off by Isolate.
func (e *Ensemble) isolated(s *Server) bool {
	for key, ls := range e.links {
		if key[0] == s.ID {
			return ls[0].isCut()
		}
	}
	return false
}

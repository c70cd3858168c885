package zktest

import (
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/flightlock/flightlock/internal/testenv/poll"
)

// A standalone server serves a client, keeps its data over a crash and restart on the same
// port, and ends an ephemeral node with the session that owned it.
func TestStandaloneServesAndSurvivesRestart(t *testing.T) {
	began := time.Now()
	s := Start(t)
	t.Logf("standalone server up in %v", time.Since(began))
	// Mode reads a JVM too busy to answer within its second as down: ask until the server
	// answers, then check what it says.
	var m string
	poll.Until(t, readyTimeout, 20*time.Millisecond, "the server to answer srvr", func() bool {
		m = s.Mode()
		return m != ModeDown
	})
	if m != ModeStandalone {
		t.Fatalf("mode %q, want %q", m, ModeStandalone)
	}
	// A session far longer than the server's restart (a few seconds for a JVM on a loaded
	// machine), so that its survival is what the test sees.
	c, _ := Connect(t, 20*time.Second, s.Addr)
	if _, err := c.Create("/kept", []byte("v"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create("/mine", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	pid := s.Pid()
	s.Stop()
	if m := s.Mode(); m != ModeDown {
		t.Fatalf("stopped server reports mode %q", m)
	}
	began = time.Now()
	s.Restart()
	t.Logf("standalone server restarted in %v", time.Since(began))
	if s.Pid() == pid || s.Pid() == 0 {
		t.Fatalf("restart kept pid %d (now %d)", pid, s.Pid())
	}
	// The session outlives the crash: the restarted server restores it from its log, with its
	// ephemeral node, and the client resumes it; closing it then removes the node. Until the
	// client has reconnected, calls fail with ErrConnectionClosed (in flight when the server
	// died), or with ErrNoServer once it tried the server in a round while it was down.
	var ok bool
	var err error
	poll.Until(t, readyTimeout, 20*time.Millisecond, "the client to reach the restarted server", func() bool {
		ok, _, err = c.Exists("/mine")
		return !errors.Is(err, zk.ErrConnectionClosed) && !errors.Is(err, zk.ErrNoServer)
	})
	if err != nil || !ok {
		t.Fatalf("ephemeral node of a live session after restart: exists=%v, %v", ok, err)
	}
	c.Close()
	c2, _ := Connect(t, 20*time.Second, s.Addr)
	v, _, err := c2.Get("/kept")
	if err != nil || string(v) != "v" {
		t.Fatalf("/kept after restart: %q, %v", v, err)
	}
	if ok, _, err := c2.Exists("/mine"); err != nil || ok {
		t.Fatalf("ephemeral node of a closed session: exists=%v, %v", ok, err)
	}
}

// A three-server ensemble elects a leader; when the leader is killed, the others elect another
// and keep serving the client's data, and the killed server rejoins as a follower.
func TestEnsembleElectsNewLeaderWhenLeaderDies(t *testing.T) {
	began := time.Now()
	e := StartEnsemble(t, 3)
	t.Logf("ensemble of 3 up in %v", time.Since(began))
	// A session far longer than an election and the client's move to a live server (a second
	// or two, a few on a loaded machine), so that its survival is what the test sees.
	c, _ := Connect(t, 20*time.Second, e.Addrs()...)
	if _, err := c.Create("/lock", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	old := e.Leader()
	if n := len(e.Followers()); n != 2 {
		t.Fatalf("%d followers, want 2", n)
	}
	began = time.Now()
	old.Stop()
	leader := e.Leader()
	t.Logf("%s elected %v after %s was killed", leader, time.Since(began), old)
	if leader == old {
		t.Fatal("the killed server still leads")
	}
	// The session lives on: its ephemeral node is served by the remaining quorum. Until the
	// client has moved from the killed server, calls fail with ErrConnectionClosed, or with
	// ErrNoServer once it tried every server in a round (servers still electing refuse it).
	var ok bool
	var err error
	poll.Until(t, readyTimeout, 20*time.Millisecond, "the client to reach the new quorum", func() bool {
		ok, _, err = c.Exists("/lock")
		return !errors.Is(err, zk.ErrConnectionClosed) && !errors.Is(err, zk.ErrNoServer)
	})
	if err != nil || !ok {
		t.Fatalf("ephemeral node after failover: exists=%v, %v", ok, err)
	}

	old.Restart()
	// Ready, with another leader: so old follows. (Asking old alone could read a busy JVM's
	// silence as down.)
	e.WaitReady(10 * time.Second)
	if l := e.Leader(); l == old {
		t.Fatalf("restarted old leader %s leads again, want it to follow %s", old, leader)
	}
}

// An isolated follower answers its clients until it drops out of the quorum, then serves no
// one, while the other two keep the quorum; healed, it follows again.
func TestIsolatedFollowerDropsOutOfQuorum(t *testing.T) {
	e := StartEnsemble(t, 3)
	leader := e.Leader()
	f := e.Followers()[0]
	c, _ := Connect(t, 4*time.Second, f.Addr)

	began := time.Now()
	e.Isolate(f)
	// Reads are served from the follower's own copy: it answers before its timeouts fire.
	if _, _, err := c.Exists("/"); err != nil {
		t.Fatalf("read from the just isolated follower: %v", err)
	}
	for f.Mode() != ModeNotServing {
		if time.Since(began) > 10*time.Second {
			t.Fatalf("isolated follower still reports %q after 10s", f.Mode())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("isolated follower stopped serving after %v (syncLimit 5 x tick 500ms = 2.5s)", time.Since(began))
	if l := e.Leader(); l != leader {
		t.Fatalf("leader moved from %s to %s though it kept a quorum", leader, l)
	}
	other, _ := Connect(t, 4*time.Second, leader.Addr)
	if _, err := other.Create("/during", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("write on the majority side: %v", err)
	}

	began = time.Now()
	e.Heal(f)
	e.WaitReady(20 * time.Second)
	t.Logf("healed follower rejoined in %v", time.Since(began))
	c2, _ := Connect(t, 4*time.Second, f.Addr)
	if _, err := c2.Sync("/"); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := c2.Exists("/during"); err != nil || !ok {
		t.Fatalf("write made during the partition, on the healed follower: exists=%v, %v", ok, err)
	}
}

// An isolated leader is replaced: the other two elect one of themselves, and the old leader,
// without a quorum of followers, stops serving. Every quorum and election connection runs
// through the ensemble's links, so no link the test did not cut lets the old leader through.
func TestIsolatedLeaderIsReplaced(t *testing.T) {
	e := StartEnsemble(t, 3)
	old := e.Leader()
	e.Isolate(old)
	began := time.Now()
	leader := e.Leader()
	t.Logf("%s took over %v after %s was isolated", leader, time.Since(began), old)
	if leader == old {
		t.Fatal("the isolated server still leads")
	}
	for old.Mode() != ModeNotServing {
		if time.Since(began) > 10*time.Second {
			t.Fatalf("isolated old leader still reports %q after 10s", old.Mode())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("isolated old leader stopped serving after %v", time.Since(began))
	c, _ := Connect(t, 4*time.Second, leader.Addr)
	if _, err := c.Create("/after", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("write on the majority side: %v", err)
	}
	e.Heal(old)
	e.WaitReady(20 * time.Second) // so old leads or follows
	if l := e.Leader(); l == old {
		t.Fatalf("healed old leader %s leads again, want it to follow %s", old, leader)
	}
}

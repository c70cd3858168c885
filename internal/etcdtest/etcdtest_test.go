package etcdtest

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// One member answers puts and gets on its client port, and its data survives a SIGKILL and a
// restart (fsync on: the write was acknowledged, so it is on disk).
func TestStartKillRestart(t *testing.T) {
	c := Start(t)
	if len(c.Members) != 1 || c.Members[0].Pid() == 0 {
		t.Fatalf("members %v", c.Members)
	}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	m := c.Members[0]
	m.Kill()
	if m.Pid() != 0 {
		t.Fatal("Pid after Kill")
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := cli.Get(short, "k"); err == nil {
		t.Fatal("a killed member answered")
	}
	cancelShort()
	m.Restart()
	resp, err := cli.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart: %v %v", resp, err)
	}
}

// Three members elect one leader; killing it elects another among the survivors, and the
// killed member rejoins after a restart.
func TestClusterLeaderKill(t *testing.T) {
	c := StartCluster(t, 3)
	leader := c.Leader(5 * time.Second)
	if len(c.Followers(leader)) != 2 {
		t.Fatalf("followers of %s: %v", leader, c.Followers(leader))
	}
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "1"); err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	next := c.Leader(10 * time.Second)
	if next == leader {
		t.Fatal("the killed member is still the leader")
	}
	if _, err := cli.Put(ctx, "k", "2"); err != nil {
		t.Fatalf("put after the leader was killed: %v", err)
	}
	leader.Restart()
	c.WaitReady(10 * time.Second)
	resp, err := cli.Get(ctx, "k")
	if err != nil || string(resp.Kvs[0].Value) != "2" {
		t.Fatalf("get: %v %v", resp, err)
	}
}

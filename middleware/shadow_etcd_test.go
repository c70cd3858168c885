package middleware

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
	"github.com/zeromicro/go-zero/rest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Shadow mode on etcd (everything above the store works unchanged): two pods of one
// service run a shadow rule on one etcd. A request that enforcing the rule would refuse, because
// the other pod's request holds the key in etcd, still runs and answers 200, and is counted as a
// conflict; the shadow lock lives in etcd under Prefix + "shadow:", apart from the enforced
// rule's key, which stays free for an enforced rule of another pod; once the first request
// returns, the shadow key is gone and the next request counts nothing.
func TestEtcdShadow(t *testing.T) {
	ec := etcdtest.Start(t)
	cli := ec.Client(t)
	rl := Rule{Method: http.MethodPost, Path: "/etcd/shadow/:uid", Key: "eshadow:{uid}", OnBusy: "reject", Shadow: true}
	podA, err := New(etcdConf(ec, rl))
	if err != nil {
		t.Fatal(err)
	}
	defer podA.Close()
	podB, err := New(etcdConf(ec, rl))
	if err != nil {
		t.Fatal(err)
	}
	defer podB.Close()
	enforced := MustNew(etcdConf(ec)) // a pod enforcing a rule on the same key
	defer enforced.Close()

	inside, leave := make(chan struct{}), make(chan struct{}) // each request to /7 on pod A, one by one
	var ran atomic.Int32
	baseA := startREST(t, podA, rest.Route{Method: http.MethodPost, Path: "/etcd/shadow/:uid", Handler: func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		if strings.HasSuffix(r.URL.Path, "/7") {
			inside <- struct{}{}
			<-leave
		}
	}})
	baseB := startREST(t, podB, rest.Route{Method: http.MethodPost, Path: "/etcd/shadow/:uid", Handler: func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
	}})

	// One request per pod first, so that the measured ones find their etcd sessions made: a
	// shadow lock gives up after shadowBound, and a session's lease grant on a loaded machine
	// may take longer than that.
	for _, base := range []string{baseA, baseB} {
		if code, _, _ := post(t, base+"/etcd/shadow/warm"); code != http.StatusOK {
			t.Fatalf("warm-up request: %d", code)
		}
	}
	ran.Store(0)
	rule := "POST /etcd/shadow/:uid"
	before := conflictCount(t, rule, "reject")
	shadowKeys := func() []string {
		resp, err := cli.Get(context.Background(), "flightlock/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range resp.Kvs {
			if k := string(kv.Key); strings.Contains(k, "shadow:") && strings.HasSuffix(k, "eshadow:7") {
				keys = append(keys, k)
			}
		}
		return keys
	}
	// Pod A's request runs holding the shadow lock. Its shadow try gives up after shadowBound (a
	// product setting) and counts a store error when etcd answers later, as on a loaded
	// machine: only then is the request sent again, up to 10 times.
	first, retried := make(chan int, 1), int32(0)
	for {
		storeErrs := conflictCount(t, rule, outcomeStoreError)
		go func() { code, _, _ := post(t, baseA+"/etcd/shadow/7"); first <- code }()
		<-inside
		if len(shadowKeys()) != 0 || conflictCount(t, rule, outcomeStoreError)-storeErrs != 1 || retried == 9 {
			break
		}
		leave <- struct{}{}
		if code := <-first; code != http.StatusOK {
			t.Fatalf("pod A's request: %d", code)
		}
		retried++
	}
	if keys := shadowKeys(); len(keys) != 1 {
		all, _ := cli.Get(context.Background(), "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		t.Fatalf("shadow lock keys under flightlock/ while pod A's request runs: %v, want one (every key in etcd: %v)", keys, all.Kvs)
	}
	if etcdExists(t, cli, "flightlock/lock:eshadow:7") {
		t.Fatal("the shadow rule holds the enforced key")
	}
	if l, err := enforced.Locker().TryLock(context.Background(), "eshadow:7"); err != nil {
		t.Fatalf("an enforced lock of the same key was held back by the shadow rule: %v", err)
	} else if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}

	sentB := int32(0) // countsOneConflict sends again after a store error
	countsOneConflict(t, "pod B's request while pod A's holds the key in etcd", rule, "reject", func() int {
		sentB++
		code, _, _ := post(t, baseB+"/etcd/shadow/7")
		return code
	})
	leave <- struct{}{}
	if code := <-first; code != http.StatusOK {
		t.Fatalf("pod A's request: %d", code)
	}
	if keys := shadowKeys(); len(keys) != 0 {
		t.Fatalf("shadow lock keys left in etcd after the request: %v", keys)
	}
	if code, _, _ := post(t, baseB+"/etcd/shadow/7"); code != http.StatusOK {
		t.Fatalf("pod B's request on a free key: %d", code)
	}
	if got := conflictCount(t, rule, "reject") - before; got != 1 {
		t.Fatalf("conflicts counted after the key was free again: %v, want still 1", got)
	}
	if n, want := ran.Load(), 2+retried+sentB; n != want {
		t.Fatalf("handlers ran %d times, want %d (shadow never holds a request back)", n, want)
	}
}

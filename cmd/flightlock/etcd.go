package main

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/flightlock/flightlock/etcdstore"
)

// connectEtcd builds the client that the service's own store would build (EtcdConf.Client:
// hosts, account, TLS), with -timeout as its dial timeout and its logs dropped (failures reach
// the operator as errors), and reads the prefix once, so that a wrong address or account
// fails here with the address in the message. The locks are read through etcdstore's
// inspector, which never hands out an owner token.
func connectEtcd(ctx context.Context, t target, timeout time.Duration) (*backend, error) {
	ec := t.etcd
	ec.DialTimeout = timeout
	cli, err := ec.Client()
	if err != nil {
		return nil, fmt.Errorf("cannot reach %s (from %s): %w", t.where(), t.from, err)
	}
	cli = cli.WithLogger(zap.NewNop())
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(pctx, t.keyPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("cannot reach %s (from %s): %w", t.where(), t.from, err)
	}
	return &backend{Inspector: etcdstore.NewInspector(cli, t.keyPrefix()), target: t, close: func() { _ = cli.Close() }}, nil
}

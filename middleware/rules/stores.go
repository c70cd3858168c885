package rules

import (
	"errors"

	"github.com/flightlock/flightlock/etcdstore"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/zkstore"
)

// Store builds the etcd client (Client) and the store that e describes, as New does; close
// closes the store and then the client, and a lock still held then runs out with its lease
// (etcdstore.Store.Close).
func (e EtcdConf) Store() (store *etcdstore.Store, close func() error, err error) {
	cli, err := e.Client()
	if err != nil {
		return nil, nil, err
	}
	s, err := etcdstore.New(cli, etcdstore.WithLeaseMargin(e.LeaseMargin))
	if err != nil {
		_ = cli.Close()
		return nil, nil, err
	}
	return s, func() error { return errors.Join(s.Close(), cli.Close()) }, nil
}

// StoreName is the name of the store s, as Rule.Store and the metrics' store label spell it:
// StoreEtcd and StoreZookeeper for their stores, StoreRedis for any other (the Redis store, or
// one a test injected).
func StoreName(s lockstore.Store) string {
	switch s.(type) {
	case *etcdstore.Store:
		return StoreEtcd
	case *zkstore.Store:
		return StoreZookeeper
	}
	return StoreRedis
}

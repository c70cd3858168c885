package rules

import (
	"errors"
	"strings"
	"testing"
)

// Client on a section with no store to connect to is an error that names the field and the
// fix, never a nil client that a caller's next line would panic on.
func TestClientOfAnEmptySectionNamesTheFieldAndTheFix(t *testing.T) {
	var cfgErr *ConfigError
	client, err := RedisConf{}.Client()
	if client != nil || !errors.As(err, &cfgErr) || cfgErr.Field != "Lock.Redis.Host" || !strings.Contains(err.Error(), "Locker()") {
		t.Errorf("RedisConf{}.Client() = %v, %v; want a ConfigError on Lock.Redis.Host that names Middleware.Locker()", client, err)
	}
	etcd, err := EtcdConf{Hosts: []string{" "}}.Client()
	if etcd != nil || !errors.As(err, &cfgErr) || cfgErr.Field != "Lock.Etcd.Hosts" {
		t.Errorf("EtcdConf{Hosts: [\" \"]}.Client() = %v, %v; want a ConfigError on Lock.Etcd.Hosts", etcd, err)
	}
}

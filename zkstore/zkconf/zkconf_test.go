package zkconf

import (
	"errors"
	"testing"
	"time"

	"github.com/zeromicro/go-zero/core/conf"

	"github.com/flightlock/flightlock/lockstore"
)

// The section loads with its defaults from YAML, and Config trims the hosts.
func TestConfLoadsWithDefaults(t *testing.T) {
	var z Conf
	if err := conf.LoadFromYamlBytes([]byte("Hosts: [' 127.0.0.1:2181 ', '127.0.0.1:2182']\n"), &z); err != nil {
		t.Fatal(err)
	}
	cfg := z.Config()
	if cfg.SessionTimeout != 40*time.Second || cfg.Root != "/flightlock" || cfg.TickTime != 0 || cfg.SyncLimit != 0 {
		t.Errorf("defaults: %+v", cfg)
	}
	if len(cfg.Hosts) != 2 || cfg.Hosts[0] != "127.0.0.1:2181" {
		t.Errorf("hosts: %q", cfg.Hosts)
	}
}

func TestValidateNamesEmptyHost(t *testing.T) {
	errs := Conf{Hosts: []string{"127.0.0.1:2181", " "}, SessionTimeout: time.Second, Root: "/x"}.Validate("Lock.Zookeeper", "")
	var ce *lockstore.ConfigError
	if len(errs) != 1 || !errors.As(errs[0], &ce) || ce.Field != "Lock.Zookeeper.Hosts[1]" {
		t.Errorf("got %v", errs)
	}
}

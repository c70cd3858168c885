package etcdconf

import (
	"testing"

	"go.uber.org/zap"

	"github.com/flightlock/flightlock/internal/testenv/etcdtest"
)

// The client logs errors only: every lock wait that a request's context ends makes etcd's
// retry interceptor warn "retrying of unary invoker failed", which the store already answers
// as an error of its own, and a service's logs would fill with them.
func TestClientLogsErrorsOnly(t *testing.T) {
	c := etcdtest.Start(t)
	cli, err := Conf{Hosts: c.Endpoints()}.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	core := cli.GetLogger().Core()
	if core.Enabled(zap.WarnLevel) || !core.Enabled(zap.ErrorLevel) {
		t.Fatalf("the client logs warnings: %v, errors: %v; want errors only", core.Enabled(zap.WarnLevel), core.Enabled(zap.ErrorLevel))
	}
}

package flightlock

import (
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(runExclusionWorker())
	}
	if os.Getenv(stressWorkerEnv) != "" {
		os.Exit(runStressWorker())
	}
	// Tests that give up grants on purpose would print their reports (keeper.reportAbandoned);
	// the tests of the report install a logger of their own.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	// Every test must leave no goroutine behind: watchdogs, notification readers, embedded
	// server clocks.
	goleak.VerifyTestMain(m)
}

// The core and lockstore import no store client but go-redis's: the stores that need one
// (etcd, ZooKeeper) and the go-zero layer live in packages of their own, so a service that
// locks on Redis never builds them.
func TestCoreImportsNoOtherStoreClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".", "./lockstore").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"go.etcd.io/", "github.com/go-zookeeper/", "github.com/zeromicro/", "go.opentelemetry.io/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the core or lockstore depends on %s", dep)
			}
		}
	}
}

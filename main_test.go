package flightlock

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// goZeroDaemons are goroutines that go-zero starts in package init (signal handling, CPU
// usage stats); lockstore's go-zero RedisConf constructor imports them. They are not ours.
var goZeroDaemons = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/zeromicro/go-zero/core/proc.init.1.func1"),
	goleak.IgnoreTopFunction("github.com/zeromicro/go-zero/core/stat.init.1.func1"),
}

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(runExclusionWorker())
	}
	if os.Getenv(stressWorkerEnv) != "" {
		os.Exit(runStressWorker())
	}
	// Every test must leave no goroutine behind: watchdogs, notification readers, embedded
	// server clocks.
	goleak.VerifyTestMain(m, goZeroDaemons...)
}

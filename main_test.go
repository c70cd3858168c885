package flightlock

import (
	"os"
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
	// Every test must leave no goroutine behind: watchdogs, notification readers, embedded
	// server clocks.
	goleak.VerifyTestMain(m)
}

package flightlock

import (
	"log/slog"
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
	// Tests that give up grants on purpose would print their reports (keeper.reportAbandoned);
	// the tests of the report install a logger of their own.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	// Every test must leave no goroutine behind: watchdogs, notification readers, embedded
	// server clocks.
	goleak.VerifyTestMain(m)
}

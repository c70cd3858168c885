package redisstore

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test must leave no goroutine behind: notification readers, batch lanes.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

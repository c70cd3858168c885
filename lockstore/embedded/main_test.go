package embedded

import (
	"testing"

	"go.uber.org/goleak"
)

// Close must stop the server's clock and connections: no goroutine outlives a test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

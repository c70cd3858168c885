package redisserver

import (
	"errors"
	"os/exec"
	"testing"
	"time"
)

// A server that exits before it is ready is reported at once (ErrExited), not at its deadline,
// and Retry starts it again, three starts in all.
func TestRetryStartsAnExitedServerThreeTimes(t *testing.T) {
	starts, begin := 0, time.Now()
	err := Retry(func() error {
		starts++
		p := &Proc{Dir: t.TempDir()}
		return p.Run("false", exec.Command("false"), time.Minute, func() (bool, error) { return false, nil })
	})
	if !errors.Is(err, ErrExited) || starts != 3 {
		t.Fatalf("Retry: %v after %d starts, want ErrExited after 3", err, starts)
	}
	if d := time.Since(begin); d > 30*time.Second {
		t.Errorf("three starts that exited took %v: Run waited for its deadline", d)
	}
}

package flightlock

import (
	"sync"
	"testing"
	"time"
)

func TestRetryStrategies(t *testing.T) {
	if _, ok := NoRetry()(1); ok {
		t.Fatal("NoRetry retried")
	}
	lin := LinearRetry(10 * time.Millisecond)
	for n := 1; n <= 5; n++ {
		if d, ok := lin(n); !ok || d != time.Duration(n)*10*time.Millisecond {
			t.Fatalf("linear(%d) = %v, %v", n, d, ok)
		}
	}
	exp := ExponentialRetry(4*time.Millisecond, 100*time.Millisecond)
	for n := 1; n <= 80; n++ {
		step := min(4*time.Millisecond<<min(n-1, 30), 100*time.Millisecond)
		d, ok := exp(n)
		if !ok || d < step/2 || d > step {
			t.Fatalf("exponential(%d) = %v, want within [%v, %v]", n, d, step/2, step)
		}
	}
	lim := LimitRetry(lin, 3)
	if _, ok := lim(2); !ok {
		t.Fatal("limit stopped early")
	}
	if _, ok := lim(3); ok {
		t.Fatal("limit of 3 attempts allowed a fourth")
	}
}

// A strategy shared by many goroutines gives each the same answers: it keeps no state.
func TestRetryIsStateless(t *testing.T) {
	lin := LimitRetry(LinearRetry(time.Millisecond), 5)
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; n < 5; n++ {
				if d, ok := lin(n); !ok || d != time.Duration(n)*time.Millisecond {
					t.Errorf("attempt %d: %v %v", n, d, ok)
				}
			}
		}()
	}
	wg.Wait()
}

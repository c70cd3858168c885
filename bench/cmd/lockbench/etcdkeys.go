package main

import (
	"fmt"
	"strconv"
	"time"
)

// Scenario 4: hotGoroutines goroutines of this process, each operation on a key drawn
// uniformly from manyKeys (contendRun). A guard per key; the floor retries at once when its
// put-if-absent finds the key taken.

// keysScenario runs scenario 4 for one row: hotGoroutines goroutines of this process over manyKeys keys.
func (b *etcdBench) keysScenario(row string, rep int) rowResult {
	return b.keysRun(row, fmt.Sprintf("k4-%d-", rep), manyKeys, hotGoroutines, b.c.d4, uint64(rep))
}

// keysRun runs n goroutines of this process for d, each operation on a key drawn uniformly
// from nkeys fresh keys named after prefix (scenario 4, and scenario 8's keys axis). A Mutex
// goroutine uses session i (b.sessions(n) must have made them).
// keysRun runs n goroutines of this process for d over nkeys fresh keys named after prefix
// (scenario 4, and scenario 8's keys axis). A Mutex goroutine uses session i (b.sessions(n)
// must have made them).
func (b *etcdBench) keysRun(row, prefix string, nkeys, n int, d time.Duration, seed uint64) rowResult {
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return b.contendRun(row, keys, n, d, seed)
}

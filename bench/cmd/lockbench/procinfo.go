package main

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/flightlock/flightlock/bench/internal/redisserver"
)

func freeAddr() string {
	addr, err := redisserver.FreeAddr()
	check(err, "free port: %v")
	return addr
}

// fsType names the file system that holds dir, from /proc/self/mountinfo (the longest mount
// point that is a prefix of dir).
func fsType(dir string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	best, typ := "", "unknown"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		mp := fields[4]
		if strings.HasPrefix(dir, mp) && len(mp) > len(best) {
			best, typ = mp, fields[sep+1]
		}
	}
	return typ
}

// procRSS is a process's resident memory in bytes (its VmRSS, which /proc/<pid>/statm counts
// in pages); 0 if unknown.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	f := strings.Fields(string(b))
	if err != nil || len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// figures calls f with the first field of every line of text whose last field is a number,
// and that number: Prometheus's text format (etcd's /metrics) and ZooKeeper's mntr alike.
func figures(text string, f func(name string, v float64)) {
	for _, line := range strings.Split(text, "\n") {
		fs := strings.Fields(line)
		if len(fs) < 2 {
			continue
		}
		if v, err := strconv.ParseFloat(fs[len(fs)-1], 64); err == nil {
			f(fs[0], v)
		}
	}
}

// procCounts are the critical sections of each worker in repetition i of x (scenario 3).
func procCounts(x *result, i int) []int64 {
	var n []int64
	if i < len(x.reps()) {
		for w := 0; ; w++ {
			v, ok := x.Reps[i]["proc"+strconv.Itoa(w)]
			if !ok {
				break
			}
			n = append(n, int64(v))
		}
	}
	return n
}

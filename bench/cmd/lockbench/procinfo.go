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
	if err != nil {
		fatalf("free port: %v", err)
	}
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

// procRSS is a process's resident memory in bytes (VmRSS in /proc/<pid>/status); 0 if unknown.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "<n> kB"
			if len(f) == 2 && f[1] == "kB" {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
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

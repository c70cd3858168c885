// Package hostinfo describes the machine a benchmark runs on, for the reports' machine tables.
package hostinfo

import (
	"os"
	"runtime"
	"strings"
)

// Machine is the machine and the Go toolchain of a run.
type Machine struct {
	CPUs   int    `json:"cpus"` // the CPUs this process may use (its affinity mask, as nproc counts)
	CPU    string `json:"cpu"`  // the first model name in /proc/cpuinfo
	Go     string `json:"go"`
	OS     string `json:"os"`
	Kernel string `json:"kernel"`
	Load   string `json:"load"` // /proc/loadavg when Collect ran
}

// Collect reads the machine; a figure it cannot read is left empty.
func Collect() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, Load: LoadNow()}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(raw))
	}
	return m
}

// LoadNow is the 1, 5 and 15 minute load averages now ("?" if unknown).
func LoadNow() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

package middleware

import "github.com/zeromicro/go-zero/core/metric"

// failOpenTotal counts requests served without their lock because Redis could not be reached
// and OnStoreError is "open". go-zero exports it when its Prometheus support is on.
var failOpenTotal = metric.NewCounterVec(&metric.CounterVecOpts{
	Namespace: "flightlock",
	Subsystem: "middleware",
	Name:      "fail_open_total",
	Help:      "Requests served without their lock because the lock store was unreachable.",
	Labels:    []string{"rule"},
})

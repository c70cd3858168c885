package middleware

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The dashboard and the alert rules in docs/grafana may query only what the middleware exports:
// a renamed metric or label must fail a test, not an operator's panel or page. This file holds
// what both tests share: the exported series and their labels, and a checker of one PromQL
// expression against them.

// exportedFamily is a flightlock metric as Prometheus scrapes it.
type exportedFamily struct {
	histogram bool            // scraped as _bucket, _count and _sum series, never by its own name
	labels    map[string]bool // its label names, with those Prometheus adds (job, instance)
}

// exportedSeries puts one sample on each of the middleware's metric vectors, so that the
// registry lists it with its label names, and returns the flightlock families it gathers.
func exportedSeries(t *testing.T) map[string]exportedFamily {
	t.Helper()
	const r = "exported-series-test"
	acquireDuration.ObserveFloat(0, r, r, r, outcomeAcquired, "redis")
	holdDuration.ObserveFloat(0, r, r, r)
	busyTotal.Inc(r, r, r)
	lostTotal.Inc(r, r, r)
	abandonedTotal.Inc(r, r, r)
	driftTotal.Inc(r, r, r)
	handoffTotal.Inc(r, r, r)
	renewalTotal.Inc(r, r, r, "ok")
	storeErrorTotal.Inc(r, r, r, "acquire")
	failOpenTotal.Inc(r, r, r)
	shadowConflictTotal.Inc(r, r, r, "reject")
	sharedTotal.Inc(r, r, r, "inflight")
	heldGauge.Set(0, r, r, r)
	waitingGauge.Set(0, r, r, r)

	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]exportedFamily{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "flightlock_") || len(f.GetMetric()) == 0 {
			continue
		}
		names := map[string]bool{"job": true, "instance": true} // added by Prometheus
		for _, l := range f.GetMetric()[0].GetLabel() {
			names[l.GetName()] = true
		}
		out[f.GetName()] = exportedFamily{histogram: f.GetType() == dto.MetricType_HISTOGRAM, labels: names}
	}
	return out
}

var (
	// quoted is a PromQL string, emptied before the expression is read: a label value such as
	// "POST /api/x" must not read as a matcher or a grouping.
	quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	// seriesRef is a flightlock series in PromQL, with its matchers if any. The lazy name stops
	// at the first place where a histogram suffix and a word boundary follow, so that
	// flightlock_acquire_duration_ms_count is the family flightlock_acquire_duration_ms.
	seriesRef = regexp.MustCompile(`(flightlock_[a-z_]+?)(_bucket|_count|_sum)?\b(\{[^}]*\})?`)
	// labelMatcher is one matcher of a selector: its label name.
	labelMatcher = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	// labelList is a clause that names labels: by, without, on, ignoring, group_left/right.
	labelList = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
)

// checkQuery returns what is wrong in one PromQL expression of ours: a flightlock series the
// middleware does not export, a histogram read without its suffix, a matcher or a grouping on
// a label that the expression's series do not have, or no flightlock series at all. It also
// returns the label names of the expression's series, for the templates that show them.
func checkQuery(expr string, exported map[string]exportedFamily) (findings []string, labels map[string]bool) {
	labels = map[string]bool{}
	expr = quoted.ReplaceAllString(expr, `""`)
	refs := seriesRef.FindAllStringSubmatch(expr, -1)
	for _, m := range refs {
		name, suffix, selector := m[1], m[2], m[3]
		fam, ok := exported[name+suffix]
		if ok {
			name, suffix = name+suffix, "" // a counter whose name ends like a histogram suffix
		} else if fam, ok = exported[name]; !ok {
			findings = append(findings, fmt.Sprintf("%s is not exported", name+suffix))
			continue
		}
		if fam.histogram && suffix == "" {
			findings = append(findings, fmt.Sprintf("%s is a histogram: read %[1]s_bucket, _count or _sum", name))
			continue
		}
		have := fam.labels
		if suffix == "_bucket" {
			have = map[string]bool{"le": true}
			for l := range fam.labels {
				have[l] = true
			}
		}
		for _, lm := range labelMatcher.FindAllStringSubmatch(selector, -1) {
			if !have[lm[1]] {
				findings = append(findings, fmt.Sprintf("%s has no label %q", name+suffix, lm[1]))
			}
		}
		for l := range have {
			labels[l] = true
		}
	}
	if len(refs) == 0 {
		findings = append(findings, "reads no flightlock series")
		return findings, labels
	}
	for _, g := range labelList.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[2], ",") {
			if l = strings.TrimSpace(l); l != "" && !labels[l] {
				findings = append(findings, fmt.Sprintf("%s (%s): its series have no label %q", g[1], g[2], l))
			}
		}
	}
	slices.Sort(findings)
	return findings, labels
}

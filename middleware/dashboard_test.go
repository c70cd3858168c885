package middleware

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The Grafana dashboard in docs/ queries only series and labels that the middleware exports:
// a renamed metric or label fails here, not on an operator's screen.
func TestDashboardQueriesExportedSeries(t *testing.T) {
	// One sample on each vector, so that the registry lists it with its label names.
	const r = "dashboard-test"
	acquireDuration.ObserveFloat(0, r, r, r, outcomeAcquired, "redis")
	holdDuration.ObserveFloat(0, r, r, r)
	busyTotal.Inc(r, r, r)
	lostTotal.Inc(r, r, r)
	handoffTotal.Inc(r, r, r)
	renewalTotal.Inc(r, r, r, "ok")
	storeErrorTotal.Inc(r, r, r, "acquire")
	failOpenTotal.Inc(r, r, r)
	shadowConflictTotal.Inc(r, r, r, "reject")
	heldGauge.Set(0, r, r, r)
	waitingGauge.Set(0, r, r, r)

	labels := map[string]map[string]bool{} // exported flightlock metric -> its label names
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "flightlock_") || len(f.GetMetric()) == 0 {
			continue
		}
		names := map[string]bool{"job": true, "instance": true} // added by Prometheus
		for _, l := range f.GetMetric()[0].GetLabel() {
			names[l.GetName()] = true
		}
		labels[f.GetName()] = names
	}

	raw, err := os.ReadFile("../docs/grafana/flightlock-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	series := regexp.MustCompile(`(flightlock_[a-z_]+?)(_bucket|_count|_sum)?\{([^}]*)\}`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)`)
	grouping := regexp.MustCompile(`by \(([^)]*)\)`)
	queries := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			used := map[string]bool{}
			for _, m := range series.FindAllStringSubmatch(tg.Expr, -1) {
				name, suffix := m[1], m[2]
				have, ok := labels[name]
				if !ok {
					t.Errorf("panel %q: %s is not exported", p.Title, name)
					continue
				}
				if suffix == "_bucket" {
					have["le"] = true
				}
				for _, lm := range matcher.FindAllStringSubmatch(m[3], -1) {
					if !have[lm[1]] {
						t.Errorf("panel %q: %s has no label %q", p.Title, name, lm[1])
					}
				}
				for l := range have {
					used[l] = true
				}
			}
			if len(used) == 0 {
				t.Errorf("panel %q: query %q reads no flightlock series", p.Title, tg.Expr)
			}
			for _, g := range grouping.FindAllStringSubmatch(tg.Expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					if l = strings.TrimSpace(l); !used[l] {
						t.Errorf("panel %q: groups by %q, which its series do not have", p.Title, l)
					}
				}
			}
		}
	}
	if queries < 20 {
		t.Errorf("the dashboard has %d queries; expected every panel of docs/grafana to be read", queries)
	}
}

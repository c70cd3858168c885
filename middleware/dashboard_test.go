package middleware

import (
	"encoding/json"
	"os"
	"testing"
)

// The Grafana dashboard in docs/ queries only series and labels that the middleware exports:
// a renamed metric or label fails here, not on an operator's screen.
func TestDashboardQueriesExportedSeries(t *testing.T) {
	exported := exportedSeries(t)
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
	queries := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			findings, _ := checkQuery(tg.Expr, exported)
			for _, f := range findings {
				t.Errorf("panel %q: %s (query %s)", p.Title, f, tg.Expr)
			}
		}
	}
	if queries < 20 {
		t.Errorf("the dashboard has %d queries; expected every panel of docs/grafana to be read", queries)
	}
}

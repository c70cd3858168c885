package middleware

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/zeromicro/go-zero/core/conf"
)

// alertRules is a Prometheus rules file: the fields of it that the tests read.
type alertRules struct {
	Groups []struct {
		Name  string      `json:"name"`
		Rules []alertRule `json:"rules"`
	} `json:"groups"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,optional"`
	Labels      map[string]string `json:"labels,optional"`
	Annotations map[string]string `json:"annotations,optional"`
}

var (
	// promDuration is a Prometheus duration as a rule's for: takes it ("0m", "3m", "1h30m").
	promDuration = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
	// templateLabel is a label that an annotation shows: {{ $labels.rule }}.
	templateLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	// byClause is an aggregation's by (...): the labels an alert keeps.
	byClause = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
)

// severities are the values of the severity label that the file's routes can count on.
var severities = []string{"critical", "warning", "info"}

// checkAlertRule returns what is wrong in one alerting rule: its expression against the
// exported series (checkQuery), a for: Prometheus cannot parse, a severity outside severities,
// a missing summary or description, and an annotation that shows a label the alert does not
// keep (the labels of its by clauses, or of its series when it does not aggregate).
func checkAlertRule(r alertRule, exported map[string]exportedFamily) []string {
	findings, labels := checkQuery(r.Expr, exported)
	if r.Alert == "" {
		findings = append(findings, "no alert name")
	}
	if r.For != "" && !promDuration.MatchString(r.For) {
		findings = append(findings, fmt.Sprintf("for: %q is not a Prometheus duration", r.For))
	}
	if !slices.Contains(severities, r.Labels["severity"]) {
		findings = append(findings, fmt.Sprintf("severity %q, want one of %v", r.Labels["severity"], severities))
	}
	for _, a := range []string{"summary", "description"} {
		if strings.TrimSpace(r.Annotations[a]) == "" {
			findings = append(findings, "no "+a+" annotation")
		}
	}
	if by := byClause.FindAllStringSubmatch(quoted.ReplaceAllString(r.Expr, `""`), -1); len(by) > 0 {
		labels = map[string]bool{}
		for _, b := range by {
			for _, l := range strings.Split(b[1], ",") {
				labels[strings.TrimSpace(l)] = true
			}
		}
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for a := range r.Annotations {
			if !yield(a) {
				return
			}
		}
	}) {
		for _, m := range templateLabel.FindAllStringSubmatch(r.Annotations[name], -1) {
			if !labels[m[1]] {
				findings = append(findings, fmt.Sprintf("annotation %s shows $labels.%s, which the alert does not keep", name, m[1]))
			}
		}
	}
	return findings
}

func loadAlertRules(t *testing.T) alertRules {
	t.Helper()
	raw, err := os.ReadFile("../docs/grafana/flightlock-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	if err := conf.LoadFromYamlBytes(raw, &rules); err != nil {
		t.Fatalf("docs/grafana/flightlock-alerts.yaml: %v", err)
	}
	return rules
}

// The alerting rules in docs/grafana query only series and labels that the middleware exports,
// show only labels their alerts keep, and cover every series that docs/operations.md tells
// operators to alert on: a renamed metric or label fails here, not in a page that never comes.
func TestAlertRulesQueryExportedSeries(t *testing.T) {
	exported := exportedSeries(t)
	file := loadAlertRules(t)
	var exprs []string
	names := map[string]bool{}
	for _, g := range file.Groups {
		if g.Name == "" {
			t.Error("a group has no name")
		}
		for _, r := range g.Rules {
			if names[r.Alert] {
				t.Errorf("alert %s is defined twice", r.Alert)
			}
			names[r.Alert] = true
			exprs = append(exprs, r.Expr)
			for _, f := range checkAlertRule(r, exported) {
				t.Errorf("alert %s: %s (expr %s)", r.Alert, f, r.Expr)
			}
		}
	}
	if len(names) < 5 {
		t.Fatalf("the rules file has %d alerts; expected the file to be read whole", len(names))
	}

	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## What to alert on")
	if !ok {
		t.Fatal(`docs/operations.md has no "What to alert on" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	if !strings.Contains(section, "grafana/flightlock-alerts.yaml") {
		t.Error(`docs/operations.md "What to alert on" does not link grafana/flightlock-alerts.yaml`)
	}
	for _, s := range slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for _, m := range regexp.MustCompile(`flightlock_[a-z_]+`).FindAllString(section, -1) {
			if !yield(m) {
				return
			}
		}
	})) {
		if !slices.ContainsFunc(exprs, func(e string) bool { return strings.Contains(e, s) }) {
			t.Errorf(`docs/operations.md says to alert on %s; no rule of the file reads it`, s)
		}
	}
}

// The checker that guards the rules file finds each kind of mistake it is there for, and
// passes a good rule: a test of the rules file that could not fail would prove nothing.
func TestAlertCheckerFindsMistakes(t *testing.T) {
	exported := exportedSeries(t)
	good := alertRule{
		Alert:       "Good",
		Expr:        `sum by (job, rule) (increase(flightlock_lost_total{rule="POST /a=b", store="etcd"}[5m])) > 0`,
		For:         "1m",
		Labels:      map[string]string{"severity": "critical"},
		Annotations: map[string]string{"summary": "{{ $labels.rule }} lost locks", "description": "on {{ $labels.job }}"},
	}
	if f := checkAlertRule(good, exported); len(f) > 0 {
		t.Fatalf("a good rule: %v, want no finding", f)
	}
	tests := []struct {
		name string
		edit func(r *alertRule)
		want string
	}{
		{"renamed metric", func(r *alertRule) { r.Expr = `increase(flightlock_locks_lost_total[5m]) > 0` },
			"flightlock_locks_lost_total is not exported"},
		{"metric that does not exist yet", func(r *alertRule) { r.Expr = `sum by (key) (increase(flightlock_leases_never_released_total[5m])) > 0` },
			"flightlock_leases_never_released_total is not exported"},
		{"matcher on a label the series lacks", func(r *alertRule) { r.Expr = `increase(flightlock_lost_total{op="acquire"}[5m]) > 0` },
			`flightlock_lost_total has no label "op"`},
		{"grouping by a label the series lack", func(r *alertRule) { r.Expr = `sum by (job, outcome) (rate(flightlock_busy_total[5m])) > 1` },
			`its series have no label "outcome"`},
		{"histogram read by its own name", func(r *alertRule) { r.Expr = `rate(flightlock_hold_duration_ms[5m]) > 1` },
			"flightlock_hold_duration_ms is a histogram"},
		{"le outside _bucket", func(r *alertRule) { r.Expr = `rate(flightlock_hold_duration_ms_count{le="10"}[5m]) > 1` },
			`flightlock_hold_duration_ms_count has no label "le"`},
		{"no flightlock series", func(r *alertRule) { r.Expr = `up == 0` }, "reads no flightlock series"},
		{"annotation shows a label aggregated away", func(r *alertRule) {
			r.Annotations = map[string]string{"summary": "{{ $labels.key }}", "description": "x"}
		},
			"shows $labels.key, which the alert does not keep"},
		{"bad for", func(r *alertRule) { r.For = "5 minutes" }, `for: "5 minutes" is not a Prometheus duration`},
		{"unknown severity", func(r *alertRule) { r.Labels = map[string]string{"severity": "page"} }, `severity "page"`},
		{"no description", func(r *alertRule) { r.Annotations = map[string]string{"summary": "x"} }, "no description annotation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := good
			tt.edit(&r)
			findings := checkAlertRule(r, exported)
			if !slices.ContainsFunc(findings, func(f string) bool { return strings.Contains(f, tt.want) }) {
				t.Fatalf("findings %q, want one containing %q", findings, tt.want)
			}
		})
	}
}

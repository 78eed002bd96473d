package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/health-router/health-router/router/event"
)

// Annotation keys of the gates: what a drain waits for besides time.
const (
	// AnnotationRespectPDB (bool, default true) holds a non-urgent drain while a
	// PodDisruptionBudget selecting a pod on the node allows no disruption.
	AnnotationRespectPDB = Prefix + "respect-pdb"
	// AnnotationHoldWhileAlerts holds a non-urgent drain while a matching alert fires in
	// Alertmanager. Syntax: see ParseAlertMatcher.
	AnnotationHoldWhileAlerts = Prefix + "hold-while-alerts"
	// AnnotationHoldWhileAlertsUnreachable says what the alert gate does when Alertmanager
	// cannot be reached: UnreachableHold (default) or UnreachableDrain.
	AnnotationHoldWhileAlertsUnreachable = Prefix + "hold-while-alerts-unreachable"
	// AnnotationDrainSettle is how long a drain counts as in flight after its NodeClaim is
	// gone (a Go duration), or "ready": until the pods that ran on the node are Ready again.
	AnnotationDrainSettle = Prefix + "drain-settle"
)

// Values of AnnotationHoldWhileAlertsUnreachable.
const (
	UnreachableHold  = "hold"
	UnreachableDrain = "drain"
)

// Gate names, as they appear in decisions, holds and metrics.
const (
	GatePDB    = "pdb"
	GateAlerts = "alerts"
)

// SettleReadyBound is the longest a drain with drain-settle "ready" stays in flight after its
// NodeClaim is gone: past it the drain counts as settled, whatever its owners' pods do.
const SettleReadyBound = 10 * time.Minute

// Holds of the gates.
const (
	HoldPDB    Hold = GatePDB    // a PodDisruptionBudget of a pod on the node allows no disruption
	HoldAlerts Hold = GateAlerts // a matching alert fires (or Alertmanager cannot be reached)
)

// GateRecheck is how soon a drain held by a gate is decided again at the latest. A PDB's
// change releases it earlier (the live router watches PDBs); alerts have no watch, so a
// minute bounds how long a resolved alert keeps a drain waiting (the alert answer itself is
// cached for seconds).
const GateRecheck = time.Minute

// Gate is the answer of one gate for one drain: whether it holds it, why, since when.
type Gate struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
	// Reason names what holds (the PDB, the alerts) or why nothing does; when the gate
	// could not get an answer it says so and whether the pool fails safe.
	Reason string `json:"reason"`
	// Since is when what holds began (the earliest matching alert's startsAt); zero if unknown.
	Since    time.Time         `json:"since,omitzero"`
	Evidence map[string]string `json:"evidence,omitempty"`
}

// Settle is the drain-settle annotation: how long a finished drain still counts as in
// flight. Zero (the default) ends it when the NodeClaim is gone.
type Settle struct {
	Duration time.Duration
	// Ready counts the drain in flight until every pod that ran on the node (by owner) is
	// Ready again elsewhere.
	Ready bool
}

func (s Settle) String() string {
	if s.Ready {
		return "ready"
	}
	return s.Duration.String()
}

// AlertMatcher is the hold-while-alerts annotation, parsed: an alert matches when its
// alertname fully matches Names and every label matcher holds.
type AlertMatcher struct {
	// Source is the annotation's value.
	Source string
	Names  *regexp.Regexp
	Labels []LabelMatcher
}

func (m *AlertMatcher) String() string { return m.Source }

// LabelMatcher is one Prometheus-style label matcher: name="v", name!="v", name=~"re",
// name!~"re". A regular expression is anchored at both ends, as in Prometheus.
type LabelMatcher struct {
	Name  string
	Op    string // "=", "!=", "=~", "!~"
	Value string
	re    *regexp.Regexp
}

// Matches reports whether the label value v (empty when the label is absent) satisfies m.
func (m LabelMatcher) Matches(v string) bool {
	switch m.Op {
	case "=":
		return v == m.Value
	case "!=":
		return v != m.Value
	case "=~":
		return m.re.MatchString(v)
	case "!~":
		return !m.re.MatchString(v)
	}
	return false
}

var (
	labelName = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*`)
)

// ParseAlertMatcher parses hold-while-alerts. The value is a regular expression (Go RE2
// syntax) over alert names, matched against the whole alertname, optionally followed by a
// list of label matchers in braces, as in a PromQL selector:
//
//	KafkaUnderReplicated.*|Zookeeper.*{severity="critical",cluster=~"prod-.*"}
//
// The matchers apply to every alert the name expression selects (here: Kafka and
// Zookeeper alerts that are critical and in a prod cluster). Values are double-quoted
// strings with Go escapes; =~ and !~ take anchored regular expressions. A trailing {...}
// that does not parse as matchers (a quantifier such as {2}) belongs to the name expression.
func ParseAlertMatcher(v string) (*AlertMatcher, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, fmt.Errorf("empty: want a regular expression over alert names")
	}
	names, labels := v, []LabelMatcher(nil)
	if strings.HasSuffix(v, "}") {
		for i := strings.LastIndex(v, "{"); i >= 0; i = strings.LastIndex(v[:i], "{") {
			if ls, err := parseLabelMatchers(v[i+1 : len(v)-1]); err == nil {
				names, labels = v[:i], ls
				break
			} else if i == 0 || labelName.MatchString(v[i+1:]) {
				// It starts like a matcher list: report its error rather than treat it
				// as part of the name expression.
				return nil, fmt.Errorf("label matchers %s: %v", v[i:], err)
			}
		}
	}
	if i := strings.LastIndex(names, "{"); i >= 0 && labelName.MatchString(names[i+1:]) {
		return nil, fmt.Errorf("label matchers %s: want a closing brace at the end", names[i:])
	}
	if strings.TrimSpace(names) == "" {
		names = ".*"
	}
	re, err := regexp.Compile("^(?:" + names + ")$")
	if err != nil {
		return nil, fmt.Errorf("alert name expression %q: %v", names, err)
	}
	return &AlertMatcher{Source: v, Names: re, Labels: labels}, nil
}

func parseLabelMatchers(s string) ([]LabelMatcher, error) {
	var out []LabelMatcher
	rest := strings.TrimSpace(s)
	for rest != "" {
		m := labelName.FindStringSubmatch(rest)
		if m == nil {
			return nil, fmt.Errorf("at %q: want name=\"value\", name!=\"value\", name=~\"regexp\" or name!~\"regexp\"", rest)
		}
		lm := LabelMatcher{Name: m[1], Op: m[2]}
		rest = rest[len(m[0]):]
		q, err := strconv.QuotedPrefix(rest)
		if err != nil || !strings.HasPrefix(q, `"`) {
			return nil, fmt.Errorf("label %s: want a double-quoted value", lm.Name)
		}
		lm.Value, _ = strconv.Unquote(q)
		if lm.Op == "=~" || lm.Op == "!~" {
			if lm.re, err = regexp.Compile("^(?:" + lm.Value + ")$"); err != nil {
				return nil, fmt.Errorf("label %s: %v", lm.Name, err)
			}
		}
		out = append(out, lm)
		rest = strings.TrimSpace(rest[len(q):])
		if rest == "" {
			break
		}
		if !strings.HasPrefix(rest, ",") {
			return nil, fmt.Errorf("at %q: want a comma between matchers", rest)
		}
		rest = strings.TrimSpace(rest[1:])
		if rest == "" {
			return nil, fmt.Errorf("trailing comma")
		}
	}
	return out, nil
}

// parseSettle parses drain-settle. With an error, the Settle returned is what applies: the
// default, or MaxDrainSettle for a duration past it.
func parseSettle(v string) (Settle, error) {
	if v == "ready" {
		return Settle{Ready: true}, nil
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil || d < 0:
		return Settle{}, fmt.Errorf("want a duration such as 10m, or ready")
	case d > MaxDrainSettle:
		// Past the bound, the bound: for pacing the longer settle is the conservative side.
		return Settle{Duration: MaxDrainSettle}, fmt.Errorf("at most %s", short(MaxDrainSettle))
	}
	return Settle{Duration: d}, nil
}

// Gated reports whether a gate can hold a decision of ev under p at now: a planned
// maintenance (an AWS Health scheduled change, a rebalance recommendation the pool drains, a
// state change of an instance that may still serve) in a pool with a gate on (an invalid
// hold-while-alerts is on). Only then does the caller need to run the gates.
func Gated(ev event.Event, p Policy, now time.Time) bool {
	return !gateExempt(ev, p, now) && (p.RespectPDB || p.HoldWhileAlerts != nil || p.alertsInvalid)
}

// gateExempt reports what no gate holds: an urgent event (AWS acts within minutes), and an
// instance that is not serving already: impaired, going away (an urgent shutting-down or
// terminated, which a contradicting EC2 makes implausible, so not urgent), or stopping or
// stopped past restart-grace. Its own pods are then unready, which is likely what takes their
// PDB to zero, and waiting would not make the workload any more ready: with no deadline to
// bound it, a gate would hold such a drain for ever. What is exempt is never a matter of the
// event's kind alone: a state change EC2 contradicts is a claim about an instance that serves,
// and is gated like any ordinary drain.
func gateExempt(ev event.Event, p Policy, now time.Time) bool {
	switch {
	case ev.Urgent() || ev.Kind == event.KindInstanceStatus:
		return true
	case ev.Kind == event.KindStateChange && ev.Implausible == "":
		return (ev.State == event.StateStopping || ev.State == event.StateStopped) && !now.Before(ev.Time.Add(p.RestartGrace))
	}
	return false
}

func exemptWhat(ev event.Event) string {
	switch {
	case ev.Urgent():
		return urgentWhat(ev)
	case ev.Kind == event.KindInstanceStatus:
		return "the instance is impaired: not serving, and no gate waits on it"
	}
	return fmt.Sprintf("the instance is %s past restart-grace: not serving, and no gate waits on it", ev.State)
}

// ApplyGates folds the gates' answers into a drain decision, as ApplyChecks folds checks.
// A planned drain (see Gated) a gate holds waits (Hold pdb or alerts, the first holding gate),
// re-decided within GateRecheck and never past deadline minus drain-lead, where it drains
// with a warning naming the gate; an urgent drain, or one of an instance not serving, never
// waits (a warning only). The caller
// runs only the gates the pool has on, and turns a gate that cannot answer into Held or
// not per the pool's setting (hold-while-alerts-unreachable), saying so in the reason. An
// invalid hold-while-alerts cannot answer either: ApplyGates adds its answer itself, the same way.
func ApplyGates(d Decision, ev event.Event, p Policy, gates []Gate, now time.Time) Decision {
	if p.alertsInvalid {
		gates = append(slices.Clip(gates), Gate{Name: GateAlerts, Held: p.AlertsUnreachable != UnreachableDrain,
			Reason: fmt.Sprintf("%s is invalid, so whether an alert fires is unknown (%s=%s)", AnnotationHoldWhileAlerts, AnnotationHoldWhileAlertsUnreachable, p.AlertsUnreachable)})
	}
	d.Gates = append(d.Gates, gates...)
	if d.Action != ActionDrain {
		return d
	}
	var held []Gate
	for _, g := range gates {
		if g.Held {
			held = append(held, g)
		}
	}
	if len(held) == 0 {
		return d
	}
	what := ""
	for i, g := range held {
		if i > 0 {
			what += "; "
		}
		what += "gate " + g.Name + ": " + g.Reason
	}
	if gateExempt(ev, p, now) {
		d.Warnings = append(d.Warnings, "draining although held ("+what+"): "+exemptWhat(ev))
		return d
	}
	until, latest, ok, reached := heldUntil(ev, p, now, GateRecheck)
	if reached {
		d.Warnings = append(d.Warnings, "draining although held, as deadline minus drain-lead is reached: "+what)
		return d
	}
	d.Action, d.Until, d.Hold = ActionDefer, until, Hold(held[0].Name)
	d.Reason = fmt.Sprintf("%s; drain held (%s); re-checked at %s", d.Reason, what, stamp(until))
	if ok {
		d.Reason += fmt.Sprintf(", draining at the latest at %s (deadline minus drain-lead)", stamp(latest))
	}
	return d
}

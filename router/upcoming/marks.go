// Package upcoming shows a node's pending outcome on the Node itself, where kubectl,
// schedulers and the people whose pods run there can read it: while an instance has an
// active record (a deferral to the pool's window or to deadline minus drain-lead, a drain
// held by pacing, a check or a gate), its Node carries
//
//   - the label healthrouter.io/maintenance-at: the planned time in Unix seconds, as GKE's
//     cloud.google.com/scheduled-maintenance-time (selectors and affinities can use it);
//   - the annotation healthrouter.io/maintenance: what is pending (kind, event, decision,
//     hold, until, how many records);
//   - in a NodePool annotated healthrouter.io/taint-upcoming=true, the taint
//     healthrouter.io/maintenance-upcoming:PreferNoSchedule, so that new pods prefer other
//     nodes while nothing is evicted for it.
//
// The marks are derived from the NodeClaim's records alone (level-triggered): they go when
// the last active record ends (drained, cancelled, superseded), and a restarted router
// writes the same marks again. Records this router cannot read leave the marks as they are.
package upcoming

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

// What the router writes on a Node.
const (
	// LabelMaintenanceAt is the planned time of the node's next pending outcome, in Unix seconds.
	LabelMaintenanceAt = policy.Prefix + "maintenance-at"
	// AnnotationMaintenance describes the pending outcome (JSON, see Pending).
	AnnotationMaintenance = policy.Prefix + "maintenance"
	// TaintKey is the PreferNoSchedule taint of healthrouter.io/taint-upcoming.
	TaintKey = policy.Prefix + "maintenance-upcoming"
)

// Pending is the annotation's value: the earliest active record of the node.
type Pending struct {
	Kind     string    `json:"kind"`
	Event    string    `json:"event"`
	Decision string    `json:"decision"`
	Hold     string    `json:"hold,omitempty"`
	Until    time.Time `json:"until"`
	// Records counts the node's active records (more than one event may be pending).
	Records int `json:"records"`
}

// Marks is what a Node carries for its pending outcome; the zero value is none.
type Marks struct {
	At         string // the label's value
	Annotation string
	Taint      string // the taint's value (the kind); "" for no taint
}

// None reports whether m marks nothing.
func (m Marks) None() bool { return m == Marks{} }

// DesiredFor returns the marks of a node the router's memory mem is of: while a reboot in
// place runs on it, the run's (its event, until AWS's start), so that the marks go after the
// run as they would after a drain, not when it begins; else Desired of its records.
func DesiredFor(mem record.Memory, taint bool) Marks {
	set := mem.Set()
	st, ok := mem.RunInProgress()
	if !ok {
		return Desired(set, taint)
	}
	p := Pending{Kind: string(event.KindScheduledChange), Event: st.EventID, Decision: string(policy.ActionRebootInPlace), Until: st.Start.UTC(),
		Records: len(set.Active()) + 1}
	raw, _ := json.Marshal(p) // plain fields: cannot fail
	m := Marks{At: strconv.FormatInt(st.Start.Unix(), 10), Annotation: string(raw)}
	if taint {
		m.Taint = string(event.KindScheduledChange)
	}
	return m
}

// Desired returns the marks of a node whose NodeClaim holds set; taint is the pool's
// healthrouter.io/taint-upcoming.
func Desired(set record.Set, taint bool) Marks {
	active := set.Active()
	if len(active) == 0 {
		return Marks{}
	}
	first := slices.MinFunc(active, func(a, b record.Record) int {
		if c := a.Until.Compare(b.Until); c != 0 {
			return c
		}
		return compareStrings(a.EventID, b.EventID)
	})
	p := Pending{Kind: string(first.Kind), Event: first.EventID, Decision: string(policy.ActionDefer), Hold: string(first.Hold),
		Until: first.Until.UTC(), Records: len(active)}
	raw, _ := json.Marshal(p) // plain fields: cannot fail
	m := Marks{At: strconv.FormatInt(first.Until.Unix(), 10), Annotation: string(raw)}
	if taint {
		m.Taint = string(first.Kind)
	}
	return m
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Current reads the marks a Node carries.
func Current(n *corev1.Node) Marks {
	m := Marks{At: n.Labels[LabelMaintenanceAt], Annotation: n.Annotations[AnnotationMaintenance]}
	for _, t := range n.Spec.Taints {
		if t.Key == TaintKey && t.Effect == corev1.TaintEffectPreferNoSchedule {
			m.Taint = t.Value
		}
	}
	return m
}

// Apply sets m on n (removing what m does not mark) and reports whether n changed. Other
// labels, annotations and taints are left as they are.
func Apply(n *corev1.Node, m Marks) bool {
	if Current(n) == m && !strayTaints(n) {
		return false
	}
	set := func(mp *map[string]string, k, v string) {
		if v == "" {
			delete(*mp, k)
			return
		}
		if *mp == nil {
			*mp = map[string]string{}
		}
		(*mp)[k] = v
	}
	set(&n.Labels, LabelMaintenanceAt, m.At)
	set(&n.Annotations, AnnotationMaintenance, m.Annotation)
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintKey })
	if m.Taint != "" {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: TaintKey, Value: m.Taint, Effect: corev1.TaintEffectPreferNoSchedule})
	}
	return true
}

// strayTaints reports a taint of TaintKey with another effect (set by hand): Apply replaces it.
func strayTaints(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == TaintKey && t.Effect != corev1.TaintEffectPreferNoSchedule
	})
}

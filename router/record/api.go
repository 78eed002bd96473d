package record

import (
	"bytes"
	"encoding/json"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The store's API: one HealthRecord per NodeClaim the router keeps anything for, named as
// the NodeClaim and owned by it (the garbage collector removes it with the NodeClaim; the
// deferral controller sweeps what it misses). Cluster-scoped, as the NodeClaim. Only the
// router's ServiceAccount holds a verb that writes it (the chart's ClusterRole); everyone
// else reads it, through `kubectl get healthrecords`.
const (
	Group      = "healthrouter.io"
	APIVersion = "v1alpha1"
	Kind       = "HealthRecord"
	// Resource is the CRD's plural, and CRDName its name.
	Resource = "healthrecords"
	CRDName  = Resource + "." + Group
)

// GroupVersion is the store's API group and version.
var GroupVersion = schema.GroupVersion{Group: Group, Version: APIVersion}

// AddToScheme registers HealthRecord and HealthRecordList.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &HealthRecord{}, &HealthRecordList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// HealthRecord is what the router remembers of one NodeClaim: its deferrals and their
// tombstones, the drain it signalled, the last `running` it handled. Spec names the
// NodeClaim's instance as the router resolved it when it first wrote; Status is the memory,
// with a summary for people (the printer columns).
type HealthRecord struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   HealthRecordSpec   `json:"spec"`
	Status HealthRecordStatus `json:"status,omitempty"`
}

// HealthRecordSpec names what the record is of.
type HealthRecordSpec struct {
	NodeClaim  string `json:"nodeClaim"`
	InstanceID string `json:"instanceID,omitempty"`
	NodeName   string `json:"nodeName,omitempty"`
	NodePool   string `json:"nodePool,omitempty"`
}

// HealthRecordStatus is the memory (Version, Memory) and its summary (Summary), written
// together by Store.Update only.
type HealthRecordStatus struct {
	// Version is the memory's format (record.Version): a newer one is a newer router's,
	// read as ErrUnreadable and never rewritten by this one.
	Version int `json:"version"`
	Memory  `json:",inline"`
	Summary `json:",inline"`
}

// Memory is what the router keeps for one NodeClaim.
type Memory struct {
	Records []Record `json:"records,omitempty"`
	// Running is the time of the latest `running` state change handled for the instance: a
	// stop that happened before it is over, whenever its event arrives.
	Running time.Time `json:"running,omitzero"`
	// Drain is the drain the router signalled Karpenter, awaiting Karpenter's delete.
	Drain *Drain `json:"drain,omitempty"`
	// Run is the reboot in place of the node (router/inplace's State, which that package
	// reads and writes): in progress, or ended and kept as a tombstone of its maintenance.
	Run json.RawMessage `json:"run,omitempty"`
	// Shadow is the would-be outcomes of a pool in shadow (router/shadow's, which that
	// package reads and writes): told, never acted on.
	Shadow json.RawMessage `json:"shadow,omitempty"`
	// NodeDrain is the router's own drain of a Node Karpenter does not manage
	// (router/nodedrain's Record, which that package reads and writes), kept in the Node's
	// HealthRecord (NodeRecordName).
	NodeDrain json.RawMessage `json:"nodeDrain,omitempty"`
	// Ledger is the shadow ledger (router/shadow's, which that package reads and writes): the
	// would-be outcomes of pools in shadow beside when Karpenter drained each NodeClaim, kept
	// after the NodeClaims are gone, in the router's one ledger record (LedgerRecordName).
	Ledger json.RawMessage `json:"ledger,omitempty"`
}

// Drain is a drain signalled: for which event, when, and how (forwarded to Karpenter's queue
// or the NodeClaim deleted).
type Drain struct {
	EventID string    `json:"eventID"`
	At      time.Time `json:"at"`
	Via     string    `json:"via,omitempty"`
}

// Set returns the memory's records as a Set.
func (m Memory) Set() Set { return Set{Records: m.Records, Running: m.Running} }

// SetSet replaces the memory's records with s's.
func (m *Memory) SetSet(s Set) { m.Records, m.Running = s.Records, s.Running }

// Equal reports whether m and o hold the same memory (as written: both read back from the
// API server, or both built here).
func (m Memory) Equal(o Memory) bool {
	a, errA := json.Marshal(m)
	b, errB := json.Marshal(o)
	return errA == nil && errB == nil && bytes.Equal(a, b)
}

// Empty reports whether there is nothing to keep.
func (m Memory) Empty() bool {
	return len(m.Records) == 0 && m.Running.IsZero() && m.Drain == nil && len(m.Run) == 0 && len(m.Shadow) == 0 && len(m.NodeDrain) == 0 && len(m.Ledger) == 0
}

// RunView is what the readers of a reboot in place that do not run it (the marks, the pacer,
// status, the watchdog) need of it: its event, the event's type and AWS's start, its step and
// when it began. The runner owns the rest (router/inplace).
type RunView struct {
	EventID string    `json:"event_id"`
	Type    string    `json:"type"`
	Start   time.Time `json:"start"`
	Step    string    `json:"step"`
	Began   time.Time `json:"began"`
	Outcome string    `json:"outcome"`
}

// RunInProgress returns the reboot in place m holds while it is not over. A run that does not
// parse is none here (the runner says why, and keeps it).
func (m Memory) RunInProgress() (RunView, bool) {
	var run RunView
	if len(m.Run) == 0 || json.Unmarshal(m.Run, &run) != nil || run.EventID == "" || run.Outcome != "" {
		return RunView{}, false
	}
	return run, true
}

// OutOfService reports whether m holds an action that has the node out of service: a drain
// signalled to Karpenter, or a reboot in place under way. The pacer counts both as drains in
// flight.
func (m Memory) OutOfService() bool {
	switch Summarize(m).Phase {
	case PhaseDraining, PhaseInPlace:
		return true
	}
	return false
}

// Phases of a HealthRecord, for people and for the readers that only count (the pacer, the
// gauges, status): what the router is doing with the NodeClaim now.
const (
	PhaseDraining = "Draining" // a drain is signalled, Karpenter has not deleted the NodeClaim yet
	PhaseInPlace  = "InPlace"  // an event is carried out by a reboot in place
	PhaseDeferred = "Deferred" // an event waits (for a window, a check, a gate)
	PhaseShadow   = "Shadow"   // would-be outcomes of a pool in shadow only: nothing is done
	PhaseIdle     = "Idle"     // only ended records, kept to recognise late duplicates
)

// Summary is the one line `kubectl get healthrecords` shows: the phase, and the event that
// decides it, its start at AWS, the action and when it is (or was) taken.
type Summary struct {
	Phase  string       `json:"phase,omitempty"`
	Event  string       `json:"event,omitempty"`
	Kind   string       `json:"kind,omitempty"`
	Start  *metav1.Time `json:"start,omitempty"`
	Action string       `json:"action,omitempty"`
	When   *metav1.Time `json:"when,omitempty"`
}

// Summarize derives the summary of m. Start is AWS's start of the earliest active record's
// event, when its body names one.
func Summarize(m Memory) Summary {
	at := func(t time.Time) *metav1.Time {
		if t.IsZero() {
			return nil
		}
		mt := metav1.NewTime(t.UTC())
		return &mt
	}
	if m.Drain != nil {
		return Summary{Phase: PhaseDraining, Event: m.Drain.EventID, Action: "drain (" + m.Drain.Via + ")", When: at(m.Drain.At)}
	}
	if run, ok := m.RunInProgress(); ok {
		return Summary{Phase: PhaseInPlace, Event: run.EventID, Kind: run.Type, Start: at(run.Start), Action: "reboot-in-place (" + run.Step + ")"}
	}
	for _, r := range m.Records {
		if r.State == StateInPlace {
			return Summary{Phase: PhaseInPlace, Event: r.EventID, Kind: string(r.Kind), Start: at(r.Start), Action: "reboot-in-place"}
		}
	}
	active := slices.DeleteFunc(slices.Clone(m.Records), func(r Record) bool { return !r.Active() })
	if len(active) > 0 {
		first := slices.MinFunc(active, func(a, b Record) int { return a.Until.Compare(b.Until) })
		action := "defer"
		if first.Hold != "" {
			action = "hold (" + string(first.Hold) + ")"
		}
		return Summary{Phase: PhaseDeferred, Event: first.EventID, Kind: string(first.Kind), Start: at(first.Start), Action: action, When: at(first.Until)}
	}
	if len(m.Shadow) > 0 {
		return Summary{Phase: PhaseShadow, Action: "none (shadow)"}
	}
	if len(m.Ledger) > 0 {
		return Summary{Phase: PhaseShadow, Action: ActionLedger}
	}
	if d, ok := m.NodeDrainView(); ok {
		switch {
		case d.Done == nil:
			return Summary{Phase: PhaseDraining, Event: d.EventID, Kind: d.Kind, Action: ActionCordonDrain, When: at(d.Started)}
		case !d.Release.IsZero():
			return Summary{Phase: PhaseIdle, Event: d.EventID, Kind: d.Kind, Action: ActionHoldUntilRelease, When: at(d.Release)}
		}
	}
	return Summary{Phase: PhaseIdle}
}

// Actions of a Node's drain in its Summary.
const (
	// ActionCordonDrain: the router cordons the Node and evicts its pods.
	ActionCordonDrain = "cordon-drain"
	// ActionHoldUntilRelease: the drain is done and the Node stays cordoned until AWS's
	// maintenance is over (When), then the router uncordons it.
	ActionHoldUntilRelease = "hold until release"
)

// NodeDrainView is what the summary needs of a Node's drain (router/nodedrain owns the
// rest): its event, when it began, when it was done, and its release.
type NodeDrainView struct {
	EventID string     `json:"event_id"`
	Kind    string     `json:"kind"`
	Started time.Time  `json:"started"`
	Done    *time.Time `json:"done,omitempty"`
	Release time.Time  `json:"release,omitzero"`
	// Closed and Running mark no drain but a close or a running kept for late reports.
	Closed  bool `json:"closed,omitempty"`
	Running bool `json:"running,omitempty"`
}

// NodeDrainView returns the drain m holds, when it is one (not a close or a running kept
// to recognise late reports). A drain that does not parse is none here.
func (m Memory) NodeDrainView() (NodeDrainView, bool) {
	var d NodeDrainView
	if len(m.NodeDrain) == 0 || json.Unmarshal(m.NodeDrain, &d) != nil || d.EventID == "" || d.Closed || d.Running {
		return NodeDrainView{}, false
	}
	return d, true
}

// HealthRecordList is a list of HealthRecords.
type HealthRecordList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []HealthRecord `json:"items"`
}

// DeepCopyInto copies m into out. Times are values; records share nothing with m.
func (m *Memory) DeepCopyInto(out *Memory) {
	*out = *m
	if m.Records != nil {
		out.Records = make([]Record, len(m.Records))
		for i, r := range m.Records {
			out.Records[i] = r.DeepCopy()
		}
	}
	if m.Drain != nil {
		d := *m.Drain
		out.Drain = &d
	}
	out.Run = slices.Clone(m.Run)
	out.Shadow = slices.Clone(m.Shadow)
	out.NodeDrain = slices.Clone(m.NodeDrain)
	out.Ledger = slices.Clone(m.Ledger)
}

// DeepCopy returns a copy of r that shares no slice with it.
func (r Record) DeepCopy() Record {
	r.PDBs = slices.Clone(r.PDBs)
	r.Event = slices.Clone(r.Event)
	return r
}

// DeepCopyInto copies s into out.
func (s *Summary) DeepCopyInto(out *Summary) {
	*out = *s
	if s.Start != nil {
		out.Start = s.Start.DeepCopy()
	}
	if s.When != nil {
		out.When = s.When.DeepCopy()
	}
}

// DeepCopyInto copies h into out.
func (h *HealthRecord) DeepCopyInto(out *HealthRecord) {
	*out = *h
	out.TypeMeta = h.TypeMeta
	h.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	h.Status.Memory.DeepCopyInto(&out.Status.Memory)
	h.Status.Summary.DeepCopyInto(&out.Status.Summary)
}

// DeepCopy returns a copy of h.
func (h *HealthRecord) DeepCopy() *HealthRecord {
	if h == nil {
		return nil
	}
	out := new(HealthRecord)
	h.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (h *HealthRecord) DeepCopyObject() runtime.Object { return h.DeepCopy() }

// DeepCopyInto copies l into out.
func (l *HealthRecordList) DeepCopyInto(out *HealthRecordList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]HealthRecord, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of l.
func (l *HealthRecordList) DeepCopy() *HealthRecordList {
	if l == nil {
		return nil
	}
	out := new(HealthRecordList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *HealthRecordList) DeepCopyObject() runtime.Object { return l.DeepCopy() }

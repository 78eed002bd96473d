// Package inplace keeps a Karpenter node through a reboot-type scheduled event instead of
// replacing it. For instance-reboot, system-reboot and system-maintenance AWS keeps the
// instance (its instance store, EBS volumes and addresses); Karpenter would replace the
// node. A pool whose action is reboot-in-place hands the NodeClaim to the Runner, which
//
//  1. records the run on the NodeClaim (Annotation) and protects it from Karpenter's
//     voluntary disruption (karpenter.sh/do-not-disrupt on the NodeClaim and on the Node:
//     a registered node's annotations are the ones Karpenter reads) and from Karpenter's
//     node repair (karpenter.sh/do-not-repair, likewise: v1.15's repair is a voluntary
//     disruption that do-not-disrupt does not stop, and the run makes the Node NotReady on
//     purpose);
//  2. cordons the Node (and puts both vetoes on it);
//  3. evicts its pods through the Eviction API, budgets respected (router/nodedrain's
//     EvictRound: the same drain helper as the router's drain of unmanaged nodes);
//  4. for instance-reboot reboots the instance itself (EC2 RebootInstances, which completes
//     the scheduled event), for the system events waits for AWS to act at the start; then
//     waits for the Node to be Ready again. A system-reboot of an instance whose reboot
//     migration is on (DescribeInstances: maintenanceOptions.rebootMigration "default") is
//     rebooted by the router too, at once in the window that began the run: EC2 then moves the
//     instance to new hardware and clears the event, which the run confirms (StepConfirm);
//     where the event is still there, the run waits for AWS's start as for the others;
//  5. uncordons the Node and removes do-not-disrupt and do-not-repair, each only if the run
//     added it.
//
// A run does not begin on a NodeClaim Karpenter is rebooting (its Rebooting condition, set by
// v1.15's node repair with RebootForRepair), and a run that has not rebooted yet holds while
// that condition is true: one reboot at a time, and Karpenter's reboot is bounded by its own
// deadlines (it replaces the node when its reboot fails).
//
// Every step is bounded (Options) and recorded in the annotation, so that a restarted or
// newly elected router resumes the run where it was. When the pods cannot be evicted in
// time or the Node does not come back Ready, the run falls back to replacing the node: it
// calls the caller's Fallback (the pool's ordinary drain through Karpenter), removes
// do-not-disrupt, and leaves the Node cordoned. The decision of each pass is the pure
// function Next; the Runner only observes, acts and records.
package inplace

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/record"
)

// Annotation holds, as JSON, the State of a reboot in place on the NodeClaim. The same key
// on the Node holds the node's part of the run (nodeMark): what the run changed on the Node,
// written in the same patch as the change, so that it is undone exactly once even when the
// router stops between the Node's write and the NodeClaim's.
const Annotation = "healthrouter.io/in-place"

// Version is the State format this router writes. A State of a later version is a newer
// router's: Read refuses it, and the Runner leaves it as it is.
const Version = 1

// Step is where a run is.
type Step string

// The steps of a run, in order. A run ends in StepDone or StepFallback with an Outcome.
const (
	// StepWait: the run is recorded and the NodeClaim protected; the Node stays in service
	// until AWS's start comes near (Options.PrepareAt), for the events AWS reboots itself.
	StepWait Step = "wait"
	// StepRelease: the maintenance was postponed far enough that the Node, emptied for the
	// old start, goes back into service: undo what the run changed on it, then StepWait.
	StepRelease Step = "release"
	// StepCordon: cordon the Node and put do-not-disrupt on it.
	StepCordon Step = "cordon"
	// StepEvict: evict the Node's pods, one bounded round per pass, until none is left.
	StepEvict Step = "evict"
	// StepReboot: instance-reboot only: EC2 RebootInstances.
	StepReboot Step = "reboot"
	// StepAwait: wait for the reboot to show: the Node NotReady, a new boot ID, or a Ready
	// transition after the router's reboot (or, when AWS reboots, after the start).
	StepAwait Step = "await"
	// StepReady: the Node went NotReady: wait for it to be Ready again.
	StepReady Step = "ready"
	// StepConfirm: a system-reboot the router rebooted for reboot migration, the Node Ready
	// again: confirm with EC2 (DescribeInstanceStatus) that the event is gone.
	StepConfirm Step = "confirm"
	// StepUncordon: undo what the run changed on the Node; then the run is done.
	StepUncordon Step = "uncordon"
	// StepDone: the run is over, the node kept (Outcome "done", or "done: <note>").
	StepDone Step = "done"
	// StepFallback: the node is to be replaced: with Outcome empty, Fallback is still to
	// be called; with Outcome "fallback: <why>", the run is over.
	StepFallback Step = "fallback"
)

// steps lists every Step, for validation.
var steps = []Step{StepWait, StepRelease, StepCordon, StepEvict, StepReboot, StepAwait, StepReady, StepConfirm, StepUncordon, StepDone, StepFallback}

// Migration is whether a system-reboot run reboots the instance itself for EC2's reboot
// migration.
type Migration string

const (
	// MigrationOn: the instance's rebootMigration is "default": a reboot the owner starts
	// moves it to new hardware and clears the system-reboot event. The router reboots it
	// once its pods are evicted.
	MigrationOn Migration = "on"
	// MigrationOff: not offered (disabled, not supported, not known), or the router's reboot
	// did not clear the event: AWS reboots the instance at the start.
	MigrationOff Migration = "off"
)

// Types are the scheduled-event types a run handles: the ones where AWS keeps the instance.
var Types = []event.ScheduledType{event.ScheduledInstanceReboot, event.ScheduledSystemReboot, event.ScheduledSystemMaintenance}

// State is a run of a reboot in place, as recorded in Annotation on the NodeClaim.
type State struct {
	Version int `json:"version"`
	// EventID is the router's event; EventARN the AWS Health event ARN (or EC2's event ID for
	// a poller finding), which stays when the event is rescheduled.
	EventID  string              `json:"event_id"`
	EventARN string              `json:"event_arn,omitempty"`
	Type     event.ScheduledType `json:"type"`
	Instance string              `json:"instance"`
	Node     string              `json:"node"`
	// Start is when AWS acts (the event's start, as rescheduled); End is the end of the
	// event's window, zero when unknown.
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitzero"`
	// MovedFrom is the start the maintenance had before the router moved it into the window
	// (event.Event's MovedFrom): a close of that start is of this run's maintenance too.
	MovedFrom time.Time `json:"moved_from,omitzero"`

	Step      Step      `json:"step"`
	Began     time.Time `json:"began"`
	StepSince time.Time `json:"step_since"`
	// Attempts counts the passes of the current step that did not finish it; LastError says
	// why the last one did not.
	Attempts  int    `json:"attempts,omitempty"`
	LastError string `json:"last_error,omitempty"`

	// What the run added, and removes again: Protected is do-not-disrupt on the NodeClaim,
	// NodeProtected the same on the Node, RepairVetoed and NodeRepairVetoed do-not-repair on
	// each, Cordoned the Node's cordon. The Runner undoes what these say (NodeChanges until
	// the cordon step is recorded), never what is written on the Node.
	Cordoned         bool `json:"cordoned,omitempty"`
	Protected        bool `json:"protected,omitempty"`
	NodeProtected    bool `json:"node_protected,omitempty"`
	RepairVetoed     bool `json:"repair_vetoed,omitempty"`
	NodeRepairVetoed bool `json:"node_repair_vetoed,omitempty"`

	// NodeChanges is what the cordon changes on the Node (UID), read from the Node and written
	// here before the cordon's patch (write-ahead): a pass that patched the Node and stopped
	// before recording the step knows what to undo from the run alone. (The Node's mark,
	// Annotation, is written in the same patch for people to read; it is never read back.)
	NodeChanges *NodeChanges `json:"node_changes,omitempty"`

	// NodeUID is the Node's UID when the run cordoned it: a Node registered again under the
	// same name is cordoned anew before the run evicts on.
	NodeUID string `json:"node_uid,omitempty"`
	// BootID is the Node's boot ID (status.nodeInfo.bootID) before the reboot: a new one
	// proves the reboot happened.
	BootID string `json:"boot_id,omitempty"`
	// Rebooted is when the router's RebootInstances succeeded; zero when AWS reboots the
	// instance at Start (system events, or a RebootInstances that kept failing).
	Rebooted time.Time `json:"rebooted,omitzero"`
	// RebootAsked is written before the router calls RebootInstances (write-ahead): a pass
	// that finds it set and Rebooted zero does not call again, since the earlier call may have
	// gone out before its outcome could be recorded. A failed call clears it.
	RebootAsked time.Time `json:"reboot_asked,omitzero"`
	// NotReadySince is when the run first saw the Node not Ready after the reboot.
	NotReadySince time.Time `json:"not_ready_since,omitzero"`
	// Migration is, for a system-reboot, whether the router reboots the instance itself
	// (reboot migration), "" until EC2 was asked (the run's first pass); MigrationWhy is
	// what EC2 said.
	Migration    Migration `json:"migration,omitempty"`
	MigrationWhy string    `json:"migration_why,omitempty"`
	// Why is why the run falls back (StepFallback), or a note on how it finished.
	Why string `json:"why,omitempty"`
	// Outcome is set when the run is over: "done", "done: <note>" or "fallback: <why>".
	Outcome string `json:"outcome,omitempty"`
}

// Over reports whether the run has ended (done or fallen back).
func (s State) Over() bool { return s.Outcome != "" }

// RebootRef is the time after which the reboot shows: the router's RebootInstances call,
// or, when AWS reboots, the event's start.
func (s State) RebootRef() time.Time {
	if !s.Rebooted.IsZero() {
		return s.Rebooted
	}
	return s.Start
}

// Read returns the run the router's memory of a NodeClaim holds (ok=false if none). err is
// set when it does not parse, is a newer router's, or is not a run anybody can trace (no
// event, an unknown step): such a value is left as it is. The run lives in the store
// (router/record's HealthRecord), which only the router writes: nothing on the NodeClaim
// itself is read as a run.
func Read(mem record.Memory) (State, bool, error) {
	if len(mem.Run) == 0 {
		return State{}, false, nil
	}
	st, err := decode(string(mem.Run))
	if err != nil {
		return State{}, false, fmt.Errorf("the run in the healthrecord: %w", err)
	}
	return st, true, nil
}

// Active reports whether the memory holds a run in progress: the Runner owns the node until
// it is done or has fallen back. A run Read refuses is not counted as a run.
func Active(mem record.Memory) bool {
	st, ok, err := Read(mem)
	return err == nil && ok && !st.Over()
}

func decode(v string) (State, error) {
	var st State
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return State{}, err
	}
	switch {
	case st.Version > Version:
		return State{}, fmt.Errorf("version %d is a newer router's (this one reads %d)", st.Version, Version)
	case st.Version < 1:
		return State{}, fmt.Errorf("no version")
	case st.EventID == "":
		return State{}, errors.New("no event_id")
	case !slices.Contains(steps, st.Step):
		return State{}, fmt.Errorf("unknown step %q", st.Step)
	}
	return st, nil
}

func encode(st State) string {
	st.Version = Version
	for _, t := range []*time.Time{&st.Start, &st.End, &st.Began, &st.StepSince, &st.Rebooted, &st.RebootAsked, &st.NotReadySince} {
		*t = t.UTC()
	}
	b, _ := json.Marshal(st) // strings, times, numbers and booleans always marshal
	return string(b)
}

// NodeChanges is what a run's cordon changes on the Node whose UID it names: whether it
// cordons it, puts do-not-disrupt and do-not-repair on it (each false where the Node had it).
type NodeChanges struct {
	UID          string `json:"uid,omitempty"`
	Cordoned     bool   `json:"cordoned,omitempty"`
	Protected    bool   `json:"protected,omitempty"`
	RepairVetoed bool   `json:"repair_vetoed,omitempty"`
}

// changesOf is what the run's cordon changes on n, as n is now.
func changesOf(n *corev1.Node) *NodeChanges {
	return &NodeChanges{UID: string(n.UID), Cordoned: !n.Spec.Unschedulable, Protected: n.Annotations[karpv1.DoNotDisruptAnnotationKey] != "true",
		RepairVetoed: n.Annotations[karpv1.DoNotRepairAnnotationKey] != "true"}
}

// changesRecordedFor reports whether the run's write-ahead NodeChanges is of the Node n (its
// UID), not of an earlier Node of the same name or none.
func (st State) changesRecordedFor(n *corev1.Node) bool {
	return st.NodeChanges != nil && st.NodeChanges.UID == string(n.UID)
}

// nodeUndo is what the run st undoes on the Node n: what its recorded cordon step says, or
// its write-ahead NodeChanges before that; nothing on a Node of another UID (registered again
// under the name: the run cordoned it anew, or did not touch it).
func nodeUndo(st State, n *corev1.Node) NodeChanges {
	var c NodeChanges
	switch {
	case st.NodeUID != "":
		c = NodeChanges{UID: st.NodeUID, Cordoned: st.Cordoned, Protected: st.NodeProtected, RepairVetoed: st.NodeRepairVetoed}
	case st.NodeChanges != nil:
		c = *st.NodeChanges
	default:
		return NodeChanges{}
	}
	if c.UID != "" && n.UID != "" && c.UID != string(n.UID) {
		return NodeChanges{}
	}
	return c
}

// nodeMark is the Node's part of a run, in Annotation on the Node: what the run changed
// there, for people to read. It is written in the same patch as the change and removed in the
// same patch as the undo; the router never reads it back (anyone with patch nodes writes it).
type nodeMark struct {
	EventID string `json:"event_id"`
	// Cordoned: the run made the Node unschedulable; Protected: the run put do-not-disrupt
	// on it; RepairVetoed: the run put do-not-repair on it.
	Cordoned     bool `json:"cordoned,omitempty"`
	Protected    bool `json:"protected,omitempty"`
	RepairVetoed bool `json:"repair_vetoed,omitempty"`
}

// UndoNode undoes on n what the run st changed there (do-not-disrupt, do-not-repair, and the
// cordon only when uncordon is set: nodeUndo) and removes the run's mark; it reports whether n
// changed.
func UndoNode(n *corev1.Node, st State, uncordon bool) bool {
	c := nodeUndo(st, n)
	_, changed := n.Annotations[Annotation]
	delete(n.Annotations, Annotation)
	if c.Protected && n.Annotations[karpv1.DoNotDisruptAnnotationKey] == "true" {
		delete(n.Annotations, karpv1.DoNotDisruptAnnotationKey)
		changed = true
	}
	if c.RepairVetoed && n.Annotations[karpv1.DoNotRepairAnnotationKey] == "true" {
		delete(n.Annotations, karpv1.DoNotRepairAnnotationKey)
		changed = true
	}
	if uncordon && c.Cordoned && n.Spec.Unschedulable {
		n.Spec.Unschedulable = false
		changed = true
	}
	return changed
}

// UndoClaim removes from a NodeClaim's annotations do-not-disrupt and do-not-repair where
// the run st added them (State.Protected, State.RepairVetoed), and the run's annotation of a
// router before the store; it reports whether they changed.
func UndoClaim(nc *karpv1.NodeClaim, st State) bool {
	before := len(nc.Annotations)
	delete(nc.Annotations, Annotation)
	undoClaim(st, nc.Annotations)
	return len(nc.Annotations) != before
}

// undoClaim removes from a NodeClaim's annotations the vetoes the run added.
func undoClaim(st State, a map[string]string) {
	if st.Protected && a[karpv1.DoNotDisruptAnnotationKey] == "true" {
		delete(a, karpv1.DoNotDisruptAnnotationKey)
	}
	if st.RepairVetoed && a[karpv1.DoNotRepairAnnotationKey] == "true" {
		delete(a, karpv1.DoNotRepairAnnotationKey)
	}
}

// KarpenterRebooting reports whether Karpenter is rebooting the NodeClaim's node: its
// Rebooting condition (v1.15's node repair, with RebootForRepair) is true.
func KarpenterRebooting(nc *karpv1.NodeClaim) bool {
	for _, c := range nc.Status.Conditions {
		if c.Type == karpv1.ConditionTypeRebooting {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

func encodeMark(m nodeMark) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// lastErrorMax bounds LastError and Why: the annotation is read with the NodeClaim by every
// watcher of NodeClaims, and a round that failed for many pods must not grow it without end.
const lastErrorMax = 512

// truncate shortens s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " …"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// Steps are the steps a run of an event of type t goes through when all goes well: the router
// reboots an instance-reboot itself; AWS reboots for the system events (a system-reboot
// the router reboots for reboot migration goes through StepReboot and StepConfirm too).
func Steps(t event.ScheduledType) []Step {
	if t == event.ScheduledInstanceReboot {
		return []Step{StepCordon, StepEvict, StepReboot, StepAwait, StepReady, StepUncordon, StepDone}
	}
	return []Step{StepCordon, StepEvict, StepAwait, StepReady, StepUncordon, StepDone}
}

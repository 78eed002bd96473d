// Package replay is the what-if tool: it decides recorded events against a cluster snapshot
// and, optionally, a file of EC2 answers, with no AWS account and no cluster.
package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/mitchellh/go-wordwrap"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-base/featuregate"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/reschedule"
	"github.com/health-router/health-router/router/signal"
)

// Options are replay's inputs.
type Options struct {
	ClusterFile string
	EventsPath  string
	AWSFile     string // optional (a file or a directory, see AWSFile); without it no pre-signal check runs
	// AlertsFile is optional: what Alertmanager's GET /api/v2/alerts returned (its JSON
	// array); without it the alert gate is not run.
	AlertsFile string
	Now        time.Time
	Gates      featuregate.FeatureGate
	Output     string // table | json
	// Strict makes Run fail (after writing the rows) when a NodePool of the snapshot has
	// annotation problems; each is written to errw either way.
	Strict bool
}

// ErrPoolProblems is Run's error under Options.Strict when a NodePool's annotations have
// problems: the pool decides on the safe side, not as its owner meant.
var ErrPoolProblems = errors.New("NodePool annotations have problems")

// Row is one (event, instance) outcome, as -o json prints it. Every key is always present.
type Row struct {
	EventID    string         `json:"event_id"`
	Kind       string         `json:"kind"`
	InstanceID string         `json:"instance_id"`
	Node       string         `json:"node"`
	NodeClaim  string         `json:"nodeclaim"`
	NodePool   string         `json:"nodepool"`
	Action     policy.Action  `json:"action"`
	Until      *time.Time     `json:"until"`
	Deadline   *time.Time     `json:"deadline"`
	Reason     string         `json:"reason"`
	Warnings   []string       `json:"warnings"`
	Checks     []policy.Check `json:"checks"`
	Gates      []policy.Gate  `json:"gates"`
	// Source is the file the event came from, and its line in a JSON-lines file:
	// "events/spot.json" (the file's path from the --events directory's parent) or
	// "storm.jsonl:3" (--events naming the file).
	Source string `json:"source"`
}

// Run replays the events and writes the rows to w; warnings about the inputs go to errw.
func Run(ctx context.Context, o Options, w, errw io.Writer) error {
	scheme, err := cluster.NewScheme()
	if err != nil {
		return err
	}
	f, err := os.Open(o.ClusterFile)
	if err != nil {
		return fmt.Errorf("--cluster: %w", err)
	}
	objs, ignored, err := cluster.Load(scheme, f)
	f.Close()
	if err != nil {
		return fmt.Errorf("--cluster %s: %w", o.ClusterFile, err)
	}
	if len(ignored) > 0 {
		fmt.Fprintf(errw, "replay: %s: ignored objects of kinds %s\n", o.ClusterFile, strings.Join(ignored, ", "))
	}
	if !slices.ContainsFunc(objs, func(o client.Object) bool { _, ok := o.(*corev1.Node); return ok }) {
		// Every event would resolve to no instance: a table of "not in this cluster" rows
		// that look like answers.
		return fmt.Errorf("--cluster %s: no Nodes in the snapshot, so no event could name one of its instances; "+
			"export them with the rest: kubectl get nodes,nodeclaims,nodepools,ec2nodeclasses -o yaml", o.ClusterFile)
	}
	problems := 0
	for _, obj := range objs {
		if np, ok := obj.(*karpv1.NodePool); ok {
			for _, p := range policy.FromAnnotations(np.Annotations).Problems {
				fmt.Fprintf(errw, "replay: NodePool %s: %s\n", np.Name, p)
				problems++
			}
		}
	}
	snap, err := cluster.NewSnapshotIndexed(scheme, slices.Concat(cluster.Indexes(), gates.Indexes()), objs...)
	if err != nil {
		return err
	}
	g := replayGates{hasPods: slices.ContainsFunc(objs, func(o client.Object) bool { _, ok := o.(*corev1.Pod); return ok })}
	if g.hasPods {
		g.pdb = gates.NewPDB(snap)
	}
	if o.AlertsFile != "" {
		b, err := os.ReadFile(o.AlertsFile)
		if err != nil {
			return fmt.Errorf("--alerts: %w", err)
		}
		if g.alerts, err = gates.ParseAlerts(b); err != nil {
			return fmt.Errorf("--alerts %s: %w", o.AlertsFile, err)
		}
		g.hasAlerts = true
	}
	var checker *checks.Checker
	var moves reschedule.API // --aws's scheduled events, for pools that move them (a what-if)
	if o.AWSFile != "" {
		af, err := LoadAWS(o.AWSFile)
		if err != nil {
			return fmt.Errorf("--aws: %w", err)
		}
		answers := &ec2Answers{file: af, calls: map[string]int{}}
		moves = reschedule.NewEvents(answers)
		clk := clock.RealClock{}
		checker = checks.NewChecker(checks.NewAMI(answers, clk), checks.NewReservations(answers, clk), o.Gates)
	}
	eng := engine.New(cluster.New(snap), checker, engine.WithGates(g.pdbGate(), g.alertGate()))

	bodies, err := readEvents(o.EventsPath)
	if err != nil {
		return fmt.Errorf("--events: %w", err)
	}
	var rows []Row
	for _, b := range bodies {
		ev, err := event.Parse(b.body)
		if err != nil {
			kind := string(ev.Kind)
			if kind == "" {
				kind = string(event.KindUnknown)
			}
			rows = append(rows, Row{EventID: ev.ID, Kind: kind, Action: policy.ActionDeadLetter, Reason: err.Error(), Source: b.source})
			continue
		}
		outs, err := eng.Decide(ctx, ev, o.Now)
		if err != nil {
			return err
		}
		for _, out := range outs {
			d := out.Decision
			if moves != nil && out.Resolved.NodePool != nil &&
				reschedule.Eligible(ev, d.Action, out.Resolved.NodeClaim != nil, policy.FromAnnotations(out.Resolved.NodePool.Annotations)) {
				if d, err = whatIfMoved(ctx, eng, moves, ev, out, o.Now); err != nil {
					return err
				}
			}
			if d.Action == policy.ActionRebootInPlace && ev.Health != nil {
				steps := inplace.Steps(ev.Health.Scheduled)
				names := make([]string, len(steps))
				for i, st := range steps {
					names[i] = string(st)
				}
				d.Reason += "; what-if steps: " + strings.Join(names, " → ")
			}
			rows = append(rows, toRow(d, b.source))
		}
	}
	if o.Output == "json" {
		enc := json.NewEncoder(w)
		for _, r := range rows {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
	} else if err := writeTable(w, rows, checker != nil, g); err != nil {
		return err
	}
	if o.Strict && problems > 0 {
		return fmt.Errorf("--strict: %w: %d problem(s), listed above", ErrPoolProblems, problems)
	}
	return nil
}

// whatIfMoved decides an instance of a pool annotated healthrouter.io/reschedule=true as the
// router would once it had moved the event into the window (reschedule.Attempt, with --aws's
// scheduled events; nothing is moved): the reason starts with "what-if: rescheduled ..." or
// "not rescheduled: why".
func whatIfMoved(ctx context.Context, eng *engine.Engine, api reschedule.API, ev event.Event, out engine.Outcome, now time.Time) (policy.Decision, error) {
	one := ev
	if len(ev.Instances) > 1 {
		body, err := signal.Canonical(ev, out.InstanceID)
		if err != nil {
			return out.Decision, err
		}
		if one, err = event.Parse(body); err != nil {
			return out.Decision, err
		}
	}
	att := reschedule.Attempt(ctx, api, one, out.InstanceID, policy.FromAnnotations(out.Resolved.NodePool.Annotations), now)
	d := out.Decision
	if att.Changed {
		o, err := eng.DecideInstance(ctx, att.Event, func(context.Context, string) (cluster.Resolved, error) { return out.Resolved, nil }, out.InstanceID, now)
		if err != nil {
			return d, err
		}
		d = o.Decision
	}
	note := att.Note
	if att.Result == reschedule.ResultMoved {
		note = "what-if: " + note
	}
	d.Reason = note + "; " + d.Reason
	return d, nil
}

// replayGates runs the gates over the snapshot: the PDB gate when the cluster file has
// Pods (and PDBs), the alert gate when an --alerts file is given.
type replayGates struct {
	pdb       *gates.PDB // nil without Pods in the cluster file
	hasPods   bool
	alerts    gates.StaticAlerts
	hasAlerts bool
}

// pdbGate and alertGate are the gates the engine runs: none (a nil interface, not a nil
// pointer) when the files give nothing to answer them.
func (g replayGates) pdbGate() interface {
	Check(context.Context, string) (policy.Gate, error)
} {
	if g.pdb == nil {
		return nil
	}
	return g.pdb
}

func (g replayGates) alertGate() interface {
	Check(context.Context, *policy.AlertMatcher, string) policy.Gate
} {
	if !g.hasAlerts {
		return nil
	}
	return g.alerts
}

func toRow(d policy.Decision, source string) Row {
	r := Row{
		EventID: d.EventID, Kind: string(d.Kind), InstanceID: d.InstanceID, Node: d.Node, NodeClaim: d.NodeClaim,
		NodePool: d.NodePool, Action: d.Action, Reason: d.Reason, Warnings: d.Warnings, Checks: d.Checks, Gates: d.Gates, Source: source,
	}
	if !d.Until.IsZero() {
		r.Until = &d.Until
	}
	if !d.Deadline.IsZero() {
		r.Deadline = &d.Deadline
	}
	if r.Warnings == nil {
		r.Warnings = []string{}
	}
	if r.Checks == nil {
		r.Checks = []policy.Check{}
	}
	if r.Gates == nil {
		r.Gates = []policy.Gate{}
	}
	return r
}

func writeTable(w io.Writer, rows []Row, checked bool, g replayGates) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tEVENT\tKIND\tINSTANCE\tNODEPOOL\tACTION\tUNTIL\tREASON")
	for _, r := range rows {
		until := "-"
		if r.Until != nil {
			until = r.Until.UTC().Format("2006-01-02 15:04")
		}
		id := r.EventID
		if len(id) > 8 {
			id = id[:8]
		}
		// The reason is the row's last column: a long one is wrapped onto lines of its own under
		// it, so that a row stays readable in a terminal (a reason ran to 353 characters).
		lines := wrap(r.Reason, reasonWidth)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", filepath.Base(r.Source), or(id, "-"), r.Kind, or(r.InstanceID, "-"), or(r.NodePool, "-"), r.Action, until, lines[0])
		for _, l := range lines[1:] {
			fmt.Fprintf(tw, "\t\t\t\t\t\t\t%s\n", l)
		}
		for _, c := range r.Checks {
			mark := "ok"
			if !c.Passed {
				mark = "FAILED"
			}
			under(tw, fmt.Sprintf("check %s %s: %s", c.Name, mark, c.Reason))
		}
		for _, gt := range r.Gates {
			mark := "open"
			if gt.Held {
				mark = "HELD"
			}
			since := ""
			if !gt.Since.IsZero() {
				since = " (since " + gt.Since.UTC().Format(time.RFC3339) + ")"
			}
			under(tw, fmt.Sprintf("gate %s %s: %s%s", gt.Name, mark, gt.Reason, since))
		}
		for _, wn := range r.Warnings {
			under(tw, "warning: "+wn)
		}
	}
	if !checked {
		fmt.Fprintln(tw, "\n(no --aws file: pre-signal checks not run)")
	}
	if !g.hasPods {
		fmt.Fprintln(tw, "(no Pods in --cluster: PodDisruptionBudget gate not run)")
	}
	if !g.hasAlerts {
		fmt.Fprintln(tw, "(no --alerts file: alert gate not run)")
	}
	return tw.Flush()
}

// under writes a row's check, gate or warning under its reason, indented and wrapped as the
// reason is.
func under(w io.Writer, s string) {
	for i, l := range wrap(s, reasonWidth-4) {
		indent := "  "
		if i > 0 {
			indent = "    "
		}
		fmt.Fprintf(w, "\t\t\t\t\t\t\t%s%s\n", indent, l)
	}
}

// reasonWidth is the widest line of a reason in the table.
const reasonWidth = 80

// wrap breaks s into lines of at most width characters at spaces (a longer word keeps a line
// of its own); it returns one line at least.
func wrap(s string, width int) []string {
	return strings.Split(wordwrap.WrapString(strings.Join(strings.Fields(s), " "), uint(width)), "\n")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

type body struct {
	source string
	body   []byte
}

// readEvents reads a JSON file (one event), a JSON-lines file (.jsonl or .ndjson), or a
// directory of both, in name order. A directory with no such file, or files with no event,
// are refused: an empty table would read as "nothing to do".
func readEvents(path string) ([]body, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	// Each body's source is named from the directory's parent ("events/spot.json"), or by
	// the file's name ("storm.jsonl:3"): short enough for the table, and enough to find it.
	base := filepath.Dir(filepath.Clean(path))
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		files = files[:0]
		for _, e := range entries {
			switch filepath.Ext(e.Name()) {
			case ".json", ".jsonl", ".ndjson":
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: no .json, .jsonl or .ndjson files in the directory", path)
		}
	}
	var out []body
	for _, f := range files {
		name := f
		if rel, err := filepath.Rel(base, f); err == nil {
			name = filepath.ToSlash(rel)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		switch filepath.Ext(f) {
		case ".jsonl", ".ndjson":
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(make([]byte, 0, 64*1024), event.MaxBodyBytes*2)
			for n := 1; sc.Scan(); n++ {
				line := bytes.TrimSpace(sc.Bytes())
				if len(line) == 0 {
					continue
				}
				out = append(out, body{source: fmt.Sprintf("%s:%d", name, n), body: append([]byte(nil), line...)})
			}
			if err := sc.Err(); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
		default:
			out = append(out, body{source: name, body: b})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no events (the files are empty)", path)
	}
	return out, nil
}

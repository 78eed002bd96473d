// Package status answers what an on-call engineer asks before a maintenance weekend: per
// NodePool, the policy the router applies, when its window opens, which events wait and
// until when, how many drains are in flight against the pacing limit, and what a pre-signal
// check holds. It reads NodePools and NodeClaims (the router's own records on them) through
// a controller-runtime client.Reader and returns a Report; render.go prints it.
package status

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

// Report is the state of every NodePool read, at Now.
type Report struct {
	Now       time.Time  `json:"now"`
	NodePools []NodePool `json:"nodePools"`
	// Nodes are the router's drains of Nodes Karpenter does not manage (their HealthRecords,
	// router/nodedrain); read when every pool is.
	Nodes []NodeDrain `json:"unmanagedNodes,omitempty"`
}

// NodeDrain is the router's own drain of a Node Karpenter does not manage: in progress, or
// done and the Node held cordoned until AWS's maintenance is over (Release).
type NodeDrain struct {
	Node     string     `json:"node"`
	Instance string     `json:"instance,omitempty"`
	EventID  string     `json:"eventId"`
	Kind     string     `json:"kind"`
	Since    time.Time  `json:"since"`
	Done     bool       `json:"done"`
	Release  *time.Time `json:"release,omitempty"`
}

// NodePool is one pool's policy and the router's work on its NodeClaims.
type NodePool struct {
	Name string `json:"name"`
	// Policy is the policy in one line, as the router reads the annotations.
	Policy string `json:"policy"`
	// Problems are annotations the router ignores, and why.
	Problems []string `json:"problems,omitempty"`
	Window   *Window  `json:"window,omitempty"`
	// Nodes counts the pool's NodeClaims: the base of a percentage drain limit.
	Nodes          int `json:"nodes"`
	DrainsInFlight int `json:"drainsInFlight"`
	// DrainLimit is max-concurrent-drains for this pool size; nil when unlimited.
	DrainLimit *int       `json:"drainLimit,omitempty"`
	Drains     []Drain    `json:"drains,omitempty"`
	Deferred   []Deferred `json:"deferred,omitempty"`
}

// Window is the pool's maintenance window as of Now.
type Window struct {
	Schedule string `json:"schedule"`
	Duration string `json:"duration"`
	Open     bool   `json:"open"`
	// OpenUntil is when the window that is open now closes.
	OpenUntil *time.Time `json:"openUntil,omitempty"`
	// Next is the next start after Now; nil if the schedule never fires again.
	Next *time.Time `json:"next,omitempty"`
}

// Drain is a NodeClaim being drained: deleted (Karpenter drains it), or signalled to
// Karpenter by the router and not gone yet.
type Drain struct {
	NodeClaim string `json:"nodeClaim"`
	Node      string `json:"node,omitempty"`
	Deleting  bool   `json:"deleting"`
	// EventID and Since come from the router's healthrouter.io/drain-signalled record; empty
	// for a NodeClaim deleted by someone else.
	EventID string     `json:"eventId,omitempty"`
	Since   *time.Time `json:"since,omitempty"`
	// InPlace is the step of a reboot in place that keeps the node (router/inplace): out of
	// service as a drain, counted in flight; "" for a drain.
	InPlace string `json:"inPlace,omitempty"`
}

// Deferred is one event the router holds for a NodeClaim.
type Deferred struct {
	NodeClaim string     `json:"nodeClaim"`
	Node      string     `json:"node,omitempty"`
	EventID   string     `json:"eventId"`
	Kind      event.Kind `json:"kind"`
	Until     time.Time  `json:"until"`
	// Hold is why it waits: window, deadline, restart-grace, pacing, check.
	Hold   string `json:"hold"`
	Reason string `json:"reason"`
}

// Holds of a deferral, as policy names them; HoldOther for a record that says none.
const (
	HoldWindow       = string(policy.HoldWindow)
	HoldDeadline     = string(policy.HoldDeadline)
	HoldRestartGrace = string(policy.HoldRestartGrace)
	HoldPacing       = string(policy.HoldPacing)
	HoldCheck        = string(policy.HoldCheck)
	HoldPDB          = string(policy.HoldPDB)
	HoldAlerts       = string(policy.HoldAlerts)
	HoldOther        = "other"
)

// Read builds the Report at now. With pool set, only that NodePool is read, and its absence
// is an error.
func Read(ctx context.Context, r client.Reader, now time.Time, pool string) (Report, error) {
	rep := Report{Now: now.UTC()}
	var pools []karpv1.NodePool
	if pool != "" {
		np := karpv1.NodePool{}
		if err := r.Get(ctx, client.ObjectKey{Name: pool}, &np); err != nil {
			return rep, fmt.Errorf("getting nodepool %s: %w", pool, err)
		}
		pools = append(pools, np)
	} else {
		var list karpv1.NodePoolList
		if err := r.List(ctx, &list); err != nil {
			return rep, fmt.Errorf("listing nodepools: %w", err)
		}
		pools = list.Items
	}
	var claims karpv1.NodeClaimList
	var opts []client.ListOption
	if pool != "" {
		opts = append(opts, client.MatchingLabels{karpv1.NodePoolLabelKey: pool})
	}
	if err := r.List(ctx, &claims, opts...); err != nil {
		return rep, fmt.Errorf("listing nodeclaims: %w", err)
	}
	// The router's memory: its HealthRecords (none where it keeps nothing).
	var hrs record.HealthRecordList
	if err := r.List(ctx, &hrs, opts...); err != nil && !meta.IsNoMatchError(err) {
		return rep, fmt.Errorf("listing healthrecords: %w", err)
	}
	mems := make(map[string]record.Memory, len(hrs.Items))
	for _, hr := range hrs.Items {
		mems[hr.Name] = hr.Status.Memory
		if d, ok := hr.Status.Memory.NodeDrainView(); ok && hr.OfNode() && pool == "" {
			nd := NodeDrain{Node: hr.Spec.NodeName, Instance: hr.Spec.InstanceID, EventID: d.EventID, Kind: d.Kind, Since: d.Started.UTC(), Done: d.Done != nil}
			if !d.Release.IsZero() {
				release := d.Release.UTC()
				nd.Release = &release
			}
			rep.Nodes = append(rep.Nodes, nd)
		}
	}
	sort.Slice(rep.Nodes, func(i, j int) bool { return rep.Nodes[i].Node < rep.Nodes[j].Node })
	byPool := map[string][]*karpv1.NodeClaim{}
	for i := range claims.Items {
		c := &claims.Items[i]
		byPool[c.Labels[karpv1.NodePoolLabelKey]] = append(byPool[c.Labels[karpv1.NodePoolLabelKey]], c)
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Name < pools[j].Name })
	for i := range pools {
		rep.NodePools = append(rep.NodePools, poolStatus(&pools[i], byPool[pools[i].Name], mems, rep.Now))
	}
	return rep, nil
}

func poolStatus(np *karpv1.NodePool, claims []*karpv1.NodeClaim, mems map[string]record.Memory, now time.Time) NodePool {
	p := policy.FromAnnotations(np.Annotations)
	s := NodePool{Name: np.Name, Policy: OneLine(p), Problems: p.Problems, Nodes: len(claims)}
	if p.Window != nil {
		w := &Window{Schedule: p.Window.Schedule, Duration: p.Window.Duration.String(), Open: p.Window.Open(now)}
		if w.Open {
			until := p.Window.Next(now.Add(-p.Window.Duration)).Add(p.Window.Duration)
			w.OpenUntil = &until
		}
		if next := p.Window.Next(now); !next.IsZero() {
			w.Next = &next
		}
		s.Window = w
	}
	if limit, limited := p.DrainLimit(len(claims)); limited {
		s.DrainLimit = &limit
	}
	sort.Slice(claims, func(i, j int) bool { return claims[i].Name < claims[j].Name })
	for _, c := range claims {
		mem := mems[c.Name]
		deleting := !c.DeletionTimestamp.IsZero()
		if deleting || mem.Drain != nil {
			d := Drain{NodeClaim: c.Name, Node: c.Status.NodeName, Deleting: deleting}
			if mem.Drain != nil {
				at := mem.Drain.At.UTC()
				d.EventID, d.Since = mem.Drain.EventID, &at
			}
			if d.Since == nil && deleting {
				// Deleted with no stamp (delete-nodeclaim mode stamps only to clear deferral
				// records, or Karpenter's own disruption): since its deletion.
				at := c.DeletionTimestamp.UTC()
				d.Since = &at
			}
			s.Drains = append(s.Drains, d)
		} else if st, ok := mem.RunInProgress(); ok {
			since := st.Began.UTC()
			s.Drains = append(s.Drains, Drain{NodeClaim: c.Name, Node: c.Status.NodeName, EventID: st.EventID, Since: &since, InPlace: string(st.Step)})
		}
		for _, d := range mem.Records {
			if d.State != record.StateDeferred {
				continue // history: cancelled or superseded
			}
			s.Deferred = append(s.Deferred, Deferred{
				NodeClaim: c.Name, Node: c.Status.NodeName, EventID: d.EventID, Kind: d.Kind,
				Until: d.Until.UTC(), Hold: holdOf(d), Reason: d.Reason,
			})
		}
	}
	s.DrainsInFlight = len(s.Drains)
	sort.SliceStable(s.Deferred, func(i, j int) bool { return s.Deferred[i].Until.Before(s.Deferred[j].Until) })
	return s
}

func holdOf(d record.Record) string {
	if d.Hold != "" {
		return string(d.Hold)
	}
	// Records written before the hold was recorded: read it from the reason.
	r := d.Reason
	switch {
	case strings.Contains(r, "drain held until the replacement is sound"):
		return HoldCheck
	case strings.Contains(r, "held by max-concurrent-drains"):
		return HoldPacing
	case strings.Contains(r, "restart-grace"):
		return HoldRestartGrace
	case strings.Contains(r, "waiting for the maintenance window"):
		return HoldWindow
	case strings.Contains(r, "deadline"):
		return HoldDeadline
	}
	return HoldOther
}

// OneLine writes a policy as one line: the default action, per-kind overrides, the window,
// drain-lead, restart-grace and max-concurrent-drains.
func OneLine(p policy.Policy) string {
	var parts []string
	if p.Shadow {
		// First: nothing of the rest is carried out (health-router status --shadow).
		parts = append(parts, "SHADOW: its policy recorded as would-be, Karpenter's behaviour carried out (status --shadow)")
	}
	if p.Default != "" {
		parts = append(parts, string(p.Default))
	} else {
		parts = append(parts, "Karpenter's (drain; rebalance ignored)")
	}
	var overrides []string
	for _, k := range event.InstanceKinds {
		if a, ok := p.Kinds[k]; ok {
			overrides = append(overrides, fmt.Sprintf("%s=%s", k, a))
		}
	}
	for _, t := range event.ScheduledTypes {
		if a, ok := p.Scheduled[t]; ok {
			overrides = append(overrides, fmt.Sprintf("%s.%s=%s", event.KindScheduledChange, t, a))
		}
	}
	if len(overrides) > 0 {
		parts[0] += " (" + strings.Join(overrides, ", ") + ")"
	}
	if p.Window != nil {
		parts = append(parts, fmt.Sprintf("window %q for %s", p.Window.Schedule, p.Window.Duration))
	} else {
		parts = append(parts, "no window")
	}
	parts = append(parts, "drain-lead "+p.DrainLead.String(), "restart-grace "+p.RestartGrace.String())
	if p.MaxConcurrentDrains != nil {
		parts = append(parts, "max-concurrent-drains "+p.MaxConcurrentDrains.String())
	} else {
		parts = append(parts, "drains unlimited")
	}
	return strings.Join(parts, "; ")
}

// Package watchdog flags Karpenter states that users otherwise find by accident, from the
// router's cache of NodePools, NodeClaims and EC2NodeClasses:
//
//   - stuck-empty: nodes of a WhenEmpty (or, with Pods cached, WhenEmptyOrUnderutilized)
//     pool empty for longer than its consolidateAfter plus a grace, and not being deleted:
//     from the pre-v1 Empty condition, and (Options.EmptyFromPods) from the pods on each
//     node, as Karpenter v1 writes no such condition; Karpenter has stopped removing empty
//     nodes until restarted (v0.37.0, and since);
//   - unavailable-image: EC2NodeClasses whose status.amis name images EC2 does not report
//     available (pending, disabled, deregistered, missing);
//   - reservation-drift: NodeClaims in capacity reservations replaced as drifted, again and
//     again, while the ReservedCapacity feature gate is off (Karpenter's replacement loop).
//
// Each finding is a Prometheus gauge, a Warning Event on the NodePool or EC2NodeClass when it
// appears or changes (not at every scan), and a count the CloudWatch publisher can send.
package watchdog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/featuregate"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/metrics"
)

// Finding names: the values of the CloudWatch Finding dimension (metrics.DimFinding).
const (
	FindingStuckEmpty       = "stuck-empty"
	FindingUnavailableImage = "unavailable-image"
	FindingReservationDrift = "reservation-drift"
)

// Event reasons, posted as Warning Events.
const (
	ReasonStuckEmpty           = "KarpenterStuckEmpty"           // on the NodePool
	ReasonImageUnavailable     = "KarpenterImageUnavailable"     // on the EC2NodeClass
	ReasonReservationDriftLoop = "KarpenterReservationDriftLoop" // on the NodePool
)

// eventAction is the action of every watchdog Event.
const eventAction = "Watch"

// Defaults of Options.
const (
	DefaultInterval       = time.Minute
	DefaultEmptyGrace     = 10 * time.Minute
	DefaultDriftWindow    = time.Hour
	DefaultDriftThreshold = 3
)

// Options tunes the watchdog; a zero field takes its default.
type Options struct {
	// Interval is the time between scans when the watchdog runs under a manager.
	Interval time.Duration
	// EmptyGrace is how long past a pool's consolidateAfter an Empty NodeClaim may stay
	// before it is flagged: Karpenter needs a disruption loop or two to act.
	EmptyGrace time.Duration
	// EmptyFromPods turns on the Karpenter v1 stuck-empty detector: the reader caches Pods
	// (trimmed by gates.TrimPod, indexed by gates.IndexPodNode) and Nodes.
	EmptyFromPods bool
	// DriftWindow is the sliding window over which reservation-drift replacements count.
	DriftWindow time.Duration
	// DriftThreshold is how many replacements in DriftWindow flag a pool.
	DriftThreshold int
	// Log receives scan errors when the watchdog runs under a manager (slog.Default if nil).
	Log *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.EmptyGrace <= 0 {
		o.EmptyGrace = DefaultEmptyGrace
	}
	if o.DriftWindow <= 0 {
		o.DriftWindow = DefaultDriftWindow
	}
	if o.DriftThreshold <= 0 {
		o.DriftThreshold = DefaultDriftThreshold
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}

// Findings is what one scan found. Only current problems are listed; an empty Findings
// means every detector looked and found nothing (or, for reservation drift, that the
// ReservedCapacity gate is on).
type Findings struct {
	At                time.Time
	StuckEmpty        []StuckEmpty
	UnavailableImages []UnavailableImages
	ReservationDrift  []ReservationDrift
}

// StuckEmpty is a WhenEmpty NodePool with NodeClaims Empty for too long.
type StuckEmpty struct {
	NodePool         string
	ConsolidateAfter time.Duration
	NodeClaims       []string  // sorted
	Since            time.Time // the earliest Empty transition (or first seen empty) among them
}

// UnavailableImages is an EC2NodeClass whose status.amis name images that are not available.
type UnavailableImages struct {
	NodeClass string
	Images    []ImageState // sorted by ID
}

// ImageState is an image and its EC2 state; StateMissing when EC2 does not know the image.
type ImageState struct {
	ID    string
	Name  string // from status.amis; may be empty
	State string
}

// ReservationDrift is a NodePool whose reserved NodeClaims were replaced as drifted at least
// Options.DriftThreshold times within Options.DriftWindow.
type ReservationDrift struct {
	NodePool     string
	Replacements int
	Window       time.Duration
}

// Counts returns, per finding name, the number of things found: stuck NodeClaims,
// unavailable (EC2NodeClass, image) pairs, and reservation-drift replacements in flagged
// pools. Every finding name is present, with 0 when nothing is found, so that a CloudWatch
// alarm sees the problem clear.
func (f Findings) Counts() map[string]int {
	c := map[string]int{FindingStuckEmpty: 0, FindingUnavailableImage: 0, FindingReservationDrift: 0}
	for _, s := range f.StuckEmpty {
		c[FindingStuckEmpty] += len(s.NodeClaims)
	}
	for _, u := range f.UnavailableImages {
		c[FindingUnavailableImage] += len(u.Images)
	}
	for _, r := range f.ReservationDrift {
		c[FindingReservationDrift] += r.Replacements
	}
	return c
}

// Watchdog scans the cluster for the stuck states. Scan does one pass; Start runs Scan
// every Options.Interval on the elected leader.
type Watchdog struct {
	reader   client.Reader
	images   *imageStates
	recorder events.EventRecorder
	clock    clock.Clock
	opts     Options
	// reservedCapacity is the ReservedCapacity gate: with it on, Karpenter's replacement
	// loop cannot happen and the reservation-drift detector reports nothing.
	reservedCapacity bool

	stuckEmptyGauge, imagesGauge, driftGauge *gaugeSet

	mu        sync.Mutex // serialises scans; guards the fields below
	deletions *deletions
	empty     *emptyTracker
	announced map[string]string       // finding key -> fingerprint of the last Event posted
	known     map[string][]ImageState // EC2NodeClass -> last answered unavailable images

	lastMu sync.Mutex
	last   Findings
}

// New returns a Watchdog that reads the cluster through reader (the manager's cache), asks
// EC2 for image states through images, posts Events with recorder and registers its gauges
// with reg. gates carries the ReservedCapacity gate (checks.NewFeatureGates).
func New(reader client.Reader, images ImagesAPI, recorder events.EventRecorder, gates featuregate.FeatureGate, clk clock.Clock, reg prometheus.Registerer, opts Options) *Watchdog {
	opts = opts.withDefaults()
	w := &Watchdog{
		reader:           reader,
		images:           newImageStates(images, clk),
		recorder:         recorder,
		clock:            clk,
		opts:             opts,
		reservedCapacity: gates.Enabled(checks.ReservedCapacity),
		stuckEmptyGauge: newGaugeSet(prometheus.GaugeOpts{Name: metrics.WatchdogStuckEmpty,
			Help: "NodeClaims empty (no pods but DaemonSet and mirror pods, or the pre-v1 Empty condition) for longer than their NodePool's consolidateAfter plus a grace, not removed by Karpenter."}, metrics.LabelNodePool),
		imagesGauge: newGaugeSet(prometheus.GaugeOpts{Name: metrics.WatchdogUnavailableImage,
			Help: "Images in an EC2NodeClass's status.amis that EC2 does not report available."}, metrics.LabelNodeClass),
		driftGauge: newGaugeSet(prometheus.GaugeOpts{Name: metrics.WatchdogReservationDrift,
			Help: "NodeClaims in capacity reservations deleted while Drifted within the watchdog's window, with the ReservedCapacity gate off."}, metrics.LabelNodePool),
		deletions: newDeletions(),
		empty:     newEmptyTracker(),
		announced: map[string]string{},
		known:     map[string][]ImageState{},
	}
	reg.MustRegister(w.stuckEmptyGauge.vec, w.imagesGauge.vec, w.driftGauge.vec)
	return w
}

// Findings returns what the latest scan found (the zero Findings before the first scan).
func (w *Watchdog) Findings() Findings {
	w.lastMu.Lock()
	defer w.lastMu.Unlock()
	return w.last
}

// InvalidateImage forgets the cached state of an image, so the next scan asks EC2 again
// (an EC2 AMI State Change event arrived for it).
func (w *Watchdog) InvalidateImage(id string) { w.images.invalidate(id) }

// NeedLeaderElection makes the watchdog run on the leader only: one replica posts Events.
func (w *Watchdog) NeedLeaderElection() bool { return true }

// Start scans at once and then every Options.Interval until ctx is done; a failed scan is
// logged and the next one tries again.
func (w *Watchdog) Start(ctx context.Context) error {
	for {
		if _, err := w.Scan(ctx); err != nil && ctx.Err() == nil {
			w.opts.Log.Error("watchdog scan incomplete", "error", err)
		}
		// The interval runs from the end of a scan: a slow scan never queues another.
		t := w.clock.NewTimer(w.opts.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// Scan does one pass over the cluster: it runs every detector, sets the gauges, posts Events
// for findings that are new or changed, and returns the findings. A detector that cannot
// read what it needs keeps its previous findings (and gauges) and its error is returned,
// joined with the others', alongside the findings of the rest.
func (w *Watchdog) Scan(ctx context.Context) (Findings, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.clock.Now()
	prev := w.Findings()
	f := Findings{At: now}
	var errs []error

	pools, poolsErr := list[karpv1.NodePoolList](ctx, w.reader)
	claims, claimsErr := list[karpv1.NodeClaimList](ctx, w.reader)
	if err := errors.Join(poolsErr, claimsErr); err != nil {
		errs = append(errs, err)
		f.StuckEmpty, f.ReservationDrift = prev.StuckEmpty, prev.ReservationDrift
	} else {
		var checked []string
		kept := keptThroughReboot(ctx, w.reader)
		checked, f.StuckEmpty = stuckEmpty(pools.Items, claims.Items, kept, now, w.opts.EmptyGrace)
		if w.opts.EmptyFromPods {
			checkedV1, found, err := w.stuckEmptyPods(ctx, pools.Items, claims.Items, kept, now, w.opts.EmptyGrace)
			if err != nil {
				// The pod path keeps its previous findings; the Empty-condition path's stand.
				errs = append(errs, err)
				checkedV1, found = sortedKeys(v1Pools(pools.Items)), prev.StuckEmpty
			}
			checked = slices.Compact(slices.Sorted(slices.Values(slices.Concat(checked, checkedV1))))
			f.StuckEmpty = mergeStuckEmpty(f.StuckEmpty, found)
		}
		w.stuckEmptyGauge.set(checked, func(pool string) float64 {
			for _, s := range f.StuckEmpty {
				if s.NodePool == pool {
					return float64(len(s.NodeClaims))
				}
			}
			return 0
		})
		f.ReservationDrift = w.reservationDrift(pools.Items, claims.Items, now)
	}

	classes, err := list[awsv1.EC2NodeClassList](ctx, w.reader)
	if err != nil {
		errs = append(errs, err)
		f.UnavailableImages = prev.UnavailableImages
	} else {
		f.UnavailableImages, err = w.unavailableImages(ctx, classes.Items)
		if err != nil {
			errs = append(errs, err)
		}
	}

	w.announce(f, pools, classes)
	w.lastMu.Lock()
	w.last = f
	w.lastMu.Unlock()
	return f, errors.Join(errs...)
}

// list lists every object of a kind; L is a list type such as karpv1.NodePoolList.
func list[L any, PL interface {
	*L
	client.ObjectList
}](ctx context.Context, r client.Reader) (*L, error) {
	l := PL(new(L))
	if err := r.List(ctx, l); err != nil {
		return l, fmt.Errorf("listing %T: %w", l, err)
	}
	return l, nil
}

// announce posts a Warning Event for each finding that is new or changed since the last
// Event, and forgets the findings that cleared (so that a recurrence is announced again).
func (w *Watchdog) announce(f Findings, pools *karpv1.NodePoolList, classes *awsv1.EC2NodeClassList) {
	current := map[string]string{}
	post := func(key, fingerprint string, obj runtime.Object, reason, format string, args ...any) {
		current[key] = fingerprint
		if w.announced[key] == fingerprint || obj == nil {
			return
		}
		w.recorder.Eventf(obj, nil, corev1.EventTypeWarning, reason, eventAction, "%s", truncate(fmt.Sprintf(format, args...)))
	}
	for _, s := range f.StuckEmpty {
		post(FindingStuckEmpty+"/"+s.NodePool, strings.Join(s.NodeClaims, ","), findPool(pools, s.NodePool), ReasonStuckEmpty,
			"%d NodeClaim(s) empty (no pods but DaemonSet and mirror pods) for longer than consolidateAfter (%s) plus %s, not removed by Karpenter (it has stopped removing empty nodes until restarted, as in v0.37.0; restart Karpenter): %s",
			len(s.NodeClaims), s.ConsolidateAfter, w.opts.EmptyGrace, abbreviate(s.NodeClaims))
	}
	for _, u := range f.UnavailableImages {
		var parts []string
		for _, im := range u.Images {
			parts = append(parts, im.String())
		}
		post(FindingUnavailableImage+"/"+u.NodeClass, strings.Join(parts, ","), findClass(classes, u.NodeClass), ReasonImageUnavailable,
			"status.amis names %d image(s) that are not available; nodes launched or drifted to them will not come up: %s",
			len(parts), abbreviate(parts))
	}
	for _, r := range f.ReservationDrift {
		// One Event when the loop is detected, not one per replacement.
		post(FindingReservationDrift+"/"+r.NodePool, "flagged", findPool(pools, r.NodePool), ReasonReservationDriftLoop,
			"%d NodeClaim(s) in capacity reservations were replaced as Drifted within %s while the ReservedCapacity feature gate is off: Karpenter's replacement loop; turn the gate on (in Karpenter and health-router) or keep the pool out of open capacity reservations",
			r.Replacements, r.Window)
	}
	w.announced = current
}

func findPool(pools *karpv1.NodePoolList, name string) runtime.Object {
	if pools == nil {
		return nil
	}
	for i := range pools.Items {
		if pools.Items[i].Name == name {
			return &pools.Items[i]
		}
	}
	return nil
}

func findClass(classes *awsv1.EC2NodeClassList, name string) runtime.Object {
	if classes == nil {
		return nil
	}
	for i := range classes.Items {
		if classes.Items[i].Name == name {
			return &classes.Items[i]
		}
	}
	return nil
}

// maxListed is how many names an Event message lists before "and N more".
const maxListed = 10

// maxNote is the longest Event note the API server accepts (events.k8s.io/v1): a longer
// one is rejected and the Event lost, so it is cut.
const maxNote = 1024

func truncate(note string) string {
	if len(note) <= maxNote {
		return note
	}
	return strings.ToValidUTF8(note[:maxNote-3], "") + "..."
}

func abbreviate(names []string) string {
	if len(names) <= maxListed {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxListed], ", "), len(names)-maxListed)
}

// gaugeSet is a gauge with one label whose series follow what exists: a label value that is
// no longer checked is deleted, not left at its last value.
type gaugeSet struct {
	vec  *prometheus.GaugeVec
	have map[string]bool
}

func newGaugeSet(opts prometheus.GaugeOpts, label string) *gaugeSet {
	return &gaugeSet{vec: prometheus.NewGaugeVec(opts, []string{label}), have: map[string]bool{}}
}

// set sets the series of every label value in values to value(label value) and deletes
// the others.
func (g *gaugeSet) set(values []string, value func(string) float64) {
	now := map[string]bool{}
	for _, v := range values {
		g.vec.WithLabelValues(v).Set(value(v))
		now[v] = true
	}
	for v := range g.have {
		if !now[v] {
			g.vec.DeleteLabelValues(v)
		}
	}
	g.have = now
}

// sortedKeys returns the keys of m, sorted.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

package main

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
)

// requests counts the API requests a client makes, by verb and resource, as the API server's
// own apiserver_request_total names them (get, list, watch, create, patch, update, delete).
type requests struct {
	mu sync.Mutex
	n  map[string]int
}

func newRequests() *requests { return &requests{n: map[string]int{}} }

// wrap is a rest.Config WrapTransport.
func (r *requests) wrap(rt http.RoundTripper) http.RoundTripper { return counted{r, rt} }

// config returns a copy of cfg whose requests r counts.
func (r *requests) config(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.WrapTransport = r.wrap
	return c
}

type counted struct {
	r    *requests
	next http.RoundTripper
}

func (c counted) RoundTrip(req *http.Request) (*http.Response, error) {
	key := verb(req) + " " + resourceOf(req.URL.Path)
	c.r.mu.Lock()
	c.r.n[key]++
	c.r.mu.Unlock()
	return c.next.RoundTrip(req)
}

func (r *requests) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.n))
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// since returns what was counted after before, sorted by count, as "verb resource n".
func since(now, before map[string]int) (lines []string, total int, by map[string]int) {
	by = map[string]int{}
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			by[k] = d
			total += d
		}
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return by[keys[i]] > by[keys[j]] || (by[keys[i]] == by[keys[j]] && keys[i] < keys[j])
	})
	for _, k := range keys {
		lines = append(lines, fmt.Sprintf("%s %d", k, by[k]))
	}
	return lines, total, by
}

func verb(r *http.Request) string {
	switch r.Method {
	case http.MethodGet:
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			return "watch"
		}
		if named(r.URL.Path) {
			return "get"
		}
		return "list"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(r.Method)
}

// segments returns the path after /api/v1 or /apis/<group>/<version>, namespace removed.
func segments(path string) []string {
	p := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(p) >= 2 && p[0] == "api":
		p = p[2:]
	case len(p) >= 3 && p[0] == "apis":
		p = p[3:]
	default:
		return p
	}
	if len(p) >= 3 && p[0] == "namespaces" {
		p = p[2:]
	}
	return p
}

func resourceOf(path string) string {
	s := segments(path)
	if len(s) == 0 {
		return path
	}
	if len(s) >= 3 { // a subresource: nodeclaims/<name>/status
		return s[0] + "/" + s[2]
	}
	return s[0]
}

func named(path string) bool { return len(segments(path)) >= 2 }

// outcomes watches NodeClaims' metadata (not whole objects: the bench must not weigh on the
// machine it measures) and tells, per instance, whether the bulk event's outcome is recorded:
// a deferral record of one of its events, a drain stamp, a deletion, or the NodeClaim gone.
// It also counts the paced pool's drains in flight on every change the watch shows.
type outcomes struct {
	mu       sync.Mutex
	events   map[string]bool // the bulk events' IDs
	want     map[string]bool // NodeClaims the bulk events name
	recorded map[string]bool
	allAt    time.Time
	onAll    chan struct{}
	// pacing
	paced       string
	inFlight    map[string]bool
	maxInFlight int
	pacedLeft   map[string]bool // paced NodeClaims named by the events and not yet gone
	present     map[string]bool // the paced pool's NodeClaims (Karpenter's replacements too)
	maxPresent  int             // the pool's largest size: the router's limit is never above its limit at that size
	pacedDone   time.Time
	onPacedDone chan struct{}
	onDeleted   func(name string)
	// spot
	watchFor map[string]chan time.Time
}

func newOutcomes(paced string) *outcomes {
	return &outcomes{events: map[string]bool{}, want: map[string]bool{}, recorded: map[string]bool{}, onAll: make(chan struct{}),
		paced: paced, inFlight: map[string]bool{}, pacedLeft: map[string]bool{}, onPacedDone: make(chan struct{}),
		watchFor: map[string]chan time.Time{}, present: map[string]bool{}}
}

// expect resets what is awaited: the events and the NodeClaims they name.
func (o *outcomes) expect(events []string, claims []string, pacedClaims []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events, o.want, o.recorded = map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, e := range events {
		o.events[e] = true
	}
	for _, c := range claims {
		o.want[c] = true
	}
	o.pacedLeft = map[string]bool{}
	for _, c := range pacedClaims {
		o.pacedLeft[c] = true
	}
	o.allAt, o.pacedDone = time.Time{}, time.Time{}
	o.onAll, o.onPacedDone = make(chan struct{}), make(chan struct{})
	o.maxInFlight = len(o.inFlight)
	o.maxPresent = len(o.present) // an earlier round's objects are gone
}

// recordedClaims is the NodeClaims recorded so far.
func (o *outcomes) recordedClaims() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.recorded))
	for c := range o.recorded {
		out = append(out, c)
	}
	return out
}

func (o *outcomes) recordedCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.recorded)
}

func (o *outcomes) deletionOf(name string) <-chan time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	ch := make(chan time.Time, 1)
	o.watchFor[name] = ch
	return ch
}

func (o *outcomes) observe(m *metav1.PartialObjectMetadata, gone bool) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	name := m.Name
	deleting := gone || m.DeletionTimestamp != nil
	stamped := m.Annotations[record.AnnotationDrainSignalled] != ""
	if deleting {
		if ch, ok := o.watchFor[name]; ok {
			ch <- now
			delete(o.watchFor, name)
		}
	}
	if o.want[name] && !o.recorded[name] {
		rec := deleting || stamped
		if !rec && m.Annotations[record.Annotation] != "" {
			set, _ := record.Decode(m.Annotations[record.Annotation])
			for _, d := range set.Records {
				if o.events[d.EventID] {
					rec = true
					break
				}
			}
		}
		if rec {
			o.recorded[name] = true
			if len(o.recorded) == len(o.want) && o.allAt.IsZero() {
				o.allAt = now
				close(o.onAll)
			}
		}
	}
	if m.Labels[karpv1.NodePoolLabelKey] != o.paced {
		return
	}
	if gone {
		delete(o.present, name)
		delete(o.inFlight, name)
		if o.onDeleted != nil {
			o.onDeleted(name)
		}
		if o.pacedLeft[name] {
			delete(o.pacedLeft, name)
			if len(o.pacedLeft) == 0 && o.pacedDone.IsZero() {
				o.pacedDone = now
				close(o.onPacedDone)
			}
		}
		return
	}
	o.present[name] = true
	o.maxPresent = max(o.maxPresent, len(o.present))
	if deleting || stamped {
		o.inFlight[name] = true
		o.maxInFlight = max(o.maxInFlight, len(o.inFlight))
	}
}

// watch starts the metadata informer on NodeClaims and waits for its first sync.
func (o *outcomes) watch(ctx context.Context, cfg *rest.Config) error {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	f := metadatainformer.NewSharedInformerFactory(mc, 0)
	inf := f.ForResource(schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodeclaims"}).Informer()
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.observe(obj.(*metav1.PartialObjectMetadata), false) },
		UpdateFunc: func(_, obj any) { o.observe(obj.(*metav1.PartialObjectMetadata), false) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
				o.observe(m, true)
			}
		},
	})
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	for _, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("nodeclaim metadata watch did not sync")
		}
	}
	return watchRecords(ctx, cfg, o.observe)
}

// watchRecords hands observe the router's memory of each NodeClaim (its HealthRecord) as the
// NodeClaim's metadata once carried it, in the keys routers before the store wrote (a drain
// as the drain-signalled stamp, records as the records key): the bench's outcomes read those.
func watchRecords(ctx context.Context, cfg *rest.Config, observe func(*metav1.PartialObjectMetadata, bool)) error {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	fac := dynamicinformer.NewDynamicSharedInformerFactory(dc, 0)
	inf := fac.ForResource(record.GroupVersion.WithResource(record.Resource)).Informer()
	hand := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		var hr record.HealthRecord
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &hr) != nil {
			return
		}
		m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: hr.Name, Labels: hr.Labels, Annotations: map[string]string{}}}
		if d := hr.Status.Drain; d != nil {
			m.Annotations[record.AnnotationDrainSignalled] = record.DrainStamp(d.EventID, d.At, d.Via)
		}
		if v, err := record.Encode(hr.Status.Memory.Set()); err == nil && v != "" {
			m.Annotations[record.Annotation] = v
		}
		observe(m, false)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: hand, UpdateFunc: func(_, obj any) { hand(obj) }}); err != nil {
		return err
	}
	fac.Start(ctx.Done())
	for _, ok := range fac.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("healthrecord watch did not sync")
		}
	}
	return nil
}

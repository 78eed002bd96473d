package calendar

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/status"
)

// Path is where Handler serves the calendar.
const Path = "/calendar.ics"

// ContentType is the calendar's media type (RFC 5545).
const ContentType = "text/calendar; charset=utf-8"

// Bounds of one answer. The calendar is read from the cluster on each request, and it names
// nodes, events and reasons: an answer stays small enough to build in memory, and a burst of
// requests cannot make the router build many at once.
const (
	// DefaultMaxEvents is how many events an answer carries, the soonest first; the calendar's
	// description counts the ones left out. Two weeks of a weekly window for 500 pools, or
	// 2,000 deferred drains.
	DefaultMaxEvents = 2000
	// DefaultMaxBytes bounds an answer's size. Measured (TestDefaultBoundsAgree): 2,000 drains
	// take 1.5 MB with one-line reasons (730 bytes an event), 3.3 MB with reasons of 1 KiB, so
	// the event bound is the one a cluster meets. A calendar beyond it is refused whole (500,
	// TextTooLarge), never cut mid-event.
	DefaultMaxBytes = 4 << 20
	// DefaultMaxInFlight is how many requests are answered at once; the others get 503 at
	// once. Calendar clients poll every 15 minutes: more than a few at a time is not a reader.
	DefaultMaxInFlight = 4
)

// Texts of the answers that are not a calendar. They are the same whatever went wrong:
// an error's own text (an API server's address, an object's name, a cache's state) stays in
// the router's log.
const (
	TextNotFound    = "no such nodepool"
	TextUnavailable = "the calendar is unavailable; the router's log says why"
	TextBusy        = "too many calendar requests at once; retry later"
	TextTooLarge    = "the calendar is too large to serve; ask for one pool with ?nodepool="
)

// HandlerOptions bound the Handler's answers; a zero field takes its default.
type HandlerOptions struct {
	MaxEvents   int
	MaxBytes    int
	MaxInFlight int
	// Log receives the detail of every failure (the answer carries none); nil: discarded.
	Log *slog.Logger
}

func (o HandlerOptions) withDefaults() HandlerOptions {
	if o.MaxEvents <= 0 {
		o.MaxEvents = DefaultMaxEvents
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// errTooLarge is what limitedBuffer answers past its bound.
var errTooLarge = errors.New("the calendar exceeds its size bound")

// limitedBuffer is a buffer that refuses to grow past max, and remembers that it did: the
// iCalendar library ignores some of its writes' errors. It has Write only (no WriteString,
// which io.WriteString would call past the bound).
type limitedBuffer struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.over || b.buf.Len()+len(p) > b.max {
		b.over = true
		return 0, errTooLarge
	}
	return b.buf.Write(p)
}

// Handler serves GET (and HEAD) Path: the calendar of every NodePool, or with
// ?nodepool=NAME of one (404 if it does not exist), read through reader at clk's time on
// each request. It reads what `health-router status` reads (NodePools and NodeClaims; the
// manager's cache serves both), and no AWS API. It is meant for the calendar's own listener
// (Server), off by default: the calendar names nodes, events and drain times.
func Handler(reader client.Reader, clk clock.PassiveClock, opts HandlerOptions) http.Handler {
	opts = opts.withDefaults()
	cal := New(DefaultHorizon)
	slots := make(chan struct{}, opts.MaxInFlight)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			w.Header().Set("Retry-After", "60")
			http.Error(w, TextBusy, http.StatusServiceUnavailable)
			return
		}
		pool := r.URL.Query().Get("nodepool")
		rep, err := status.Read(r.Context(), reader, clk.Now(), pool)
		if err != nil {
			if apierrors.IsNotFound(err) {
				http.Error(w, TextNotFound, http.StatusNotFound)
				return
			}
			opts.Log.Error("reading the calendar", "nodepool", pool, "err", err)
			http.Error(w, TextUnavailable, http.StatusInternalServerError)
			return
		}
		// Written whole before the header, so that a failure is a 500, not half a calendar.
		buf := &limitedBuffer{max: opts.MaxBytes}
		omitted, err := cal.WriteLimited(buf, rep, opts.MaxEvents)
		switch {
		case buf.over || errors.Is(err, errTooLarge):
			opts.Log.Error("the calendar exceeds its size bound", "nodepool", pool, "max_bytes", opts.MaxBytes)
			http.Error(w, TextTooLarge, http.StatusInternalServerError)
			return
		case err != nil:
			opts.Log.Error("writing the calendar", "nodepool", pool, "err", err)
			http.Error(w, TextUnavailable, http.StatusInternalServerError)
			return
		}
		if omitted > 0 {
			opts.Log.Warn("the calendar left out its latest events", "nodepool", pool, "omitted", omitted, "max_events", opts.MaxEvents)
		}
		w.Header().Set("Content-Type", ContentType)
		w.Header().Set("Content-Disposition", `inline; filename="health-router.ics"`)
		w.Header().Set("Content-Length", fmt.Sprint(buf.buf.Len()))
		// Each request reads the cluster: a cache in between would show a drain that is done.
		// private: a shared cache (a proxy, a CDN) keeps no copy of what names the nodes.
		w.Header().Set("Cache-Control", "no-cache, private")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(buf.buf.Bytes())
	})
	return mux
}

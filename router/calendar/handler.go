package calendar

import (
	"bytes"
	"fmt"
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

// Handler serves GET (and HEAD) Path: the calendar of every NodePool, or with
// ?nodepool=NAME of one (404 if it does not exist), read through reader at clk's time on
// each request. It reads what `health-router status` reads (NodePools and NodeClaims; the
// manager's cache serves both), and no AWS API. It is meant for the metrics server:
//
//	metricsserver.Options{ExtraHandlers: map[string]http.Handler{calendar.Path: calendar.Handler(mgr.GetClient(), clock.RealClock{})}}
func Handler(reader client.Reader, clk clock.PassiveClock) http.Handler {
	cal := New(DefaultHorizon)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, r *http.Request) {
		pool := r.URL.Query().Get("nodepool")
		rep, err := status.Read(r.Context(), reader, clk.Now(), pool)
		if err != nil {
			code := http.StatusInternalServerError
			if apierrors.IsNotFound(err) {
				code = http.StatusNotFound
			}
			http.Error(w, err.Error(), code)
			return
		}
		// Written whole before the header, so that a failure is a 500, not half a calendar.
		var buf bytes.Buffer
		if err := cal.Write(&buf, rep); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", ContentType)
		w.Header().Set("Content-Disposition", `inline; filename="health-router.ics"`)
		w.Header().Set("Content-Length", fmt.Sprint(buf.Len()))
		// Each request reads the cluster: a cache in between would show a drain that is done.
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(buf.Bytes())
	})
	return mux
}

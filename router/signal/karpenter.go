package signal

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/health-router/health-router/router/event"
)

// KarpenterVersion is the version of the Karpenter the router signals (--karpenter-version):
// what Karpenter's interruption controller can parse of a forwarded event depends on it. The
// zero value is an unknown version.
type KarpenterVersion struct{ Major, Minor, Patch int }

// Karpenter versions the router knows the interruption parsers of. Karpenter deletes a message
// it has no parser for (or cannot parse) as a no-op, without a trace; the Spot, scheduled-change,
// state-change and rebalance parsers are the same from v1.0.0 on (test/karpenter-versions
// checks every forwarded body against v1.0, v1.10 and v1.15).
var (
	// OldestKarpenter is the oldest Karpenter the router serves: the first of the karpenter.sh/v1
	// API it reads.
	OldestKarpenter = KarpenterVersion{1, 0, 0}
	// reservationParserSince is the first Karpenter with a parser for EC2 Capacity Reservation
	// Instance Interruption Warning.
	reservationParserSince = KarpenterVersion{1, 10, 0}
)

var karpenterVersionPattern = regexp.MustCompile(`^v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$`)

// ParseKarpenterVersion reads a Karpenter version as its release, its chart or its image tag
// write it: "v1.9.3", "1.9.3", "1.10" (patch 0), "1.9.3-rc.1". An empty string is the unknown
// version. A version older than OldestKarpenter is refused: the router does not serve it.
func ParseKarpenterVersion(s string) (KarpenterVersion, error) {
	if s == "" {
		return KarpenterVersion{}, nil
	}
	m := karpenterVersionPattern.FindStringSubmatch(s)
	if m == nil {
		return KarpenterVersion{}, fmt.Errorf("karpenter version %q: want a version such as v1.9.3", s)
	}
	var v KarpenterVersion
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Patch, _ = strconv.Atoi(m[3])
	}
	if v.Less(OldestKarpenter) {
		return KarpenterVersion{}, fmt.Errorf("karpenter version %q: the router serves Karpenter %s and newer (the karpenter.sh/v1 API)", s, OldestKarpenter)
	}
	return v, nil
}

// IsZero reports whether the version is unknown.
func (v KarpenterVersion) IsZero() bool { return v == KarpenterVersion{} }

// Less reports whether v is older than o.
func (v KarpenterVersion) Less(o KarpenterVersion) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

// String is the version as Karpenter's releases name it ("v1.10.0"), or "unknown".
func (v KarpenterVersion) String() string {
	if v.IsZero() {
		return "unknown"
	}
	return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch)
}

// KarpenterParsesSince returns the first Karpenter version whose interruption controller
// parses the canonical body of ev; ok is false for what no version parses (an AMI state
// change, a Capacity Block's expiration, the router's own findings).
func KarpenterParsesSince(ev event.Event) (since KarpenterVersion, ok bool) {
	switch {
	case ev.Source == "aws.ec2" && ev.Kind == event.KindCapacityReservation:
		return reservationParserSince, true
	case ev.Source == "aws.ec2" && (ev.Kind == event.KindSpotInterruption || ev.Kind == event.KindStateChange || ev.Kind == event.KindRebalance):
		return OldestKarpenter, true
	case ev.Source == "aws.health" && ev.Kind == event.KindScheduledChange:
		return OldestKarpenter, true
	}
	return KarpenterVersion{}, false
}

// Parses reports whether the Karpenter of version v (zero: unknown, taken as the newest) has
// an interruption parser for ev's canonical body (KarpenterParsesSince).
func (v KarpenterVersion) Parses(ev event.Event) bool {
	since, ok := KarpenterParsesSince(ev)
	return ok && (v.IsZero() || !v.Less(since))
}

// SetKarpenterVersion tells the signaller which Karpenter it signals. An unknown version (the
// zero value, the default) is taken as the newest: the router is built and tested against it
// (go.mod's Karpenter, the real-Karpenter suite), and a forward Karpenter cannot parse is still
// caught by the confirm-or-fallback. A known older version makes a drain that Karpenter would
// drop as a kind it has no parser for delete the NodeClaim at once instead (Via).
func (s *Signaller) SetKarpenterVersion(v KarpenterVersion) { s.karpenter = v }

// KarpenterVersion returns the Karpenter version the signaller assumes (zero: unknown).
func (s *Signaller) KarpenterVersion() KarpenterVersion { return s.karpenter }

// SameParsers reports whether Karpenter versions a and b parse the same forwarded kinds (an
// unknown version is taken as the newest).
func SameParsers(a, b KarpenterVersion) bool {
	parses := func(v KarpenterVersion) bool { return v.IsZero() || !v.Less(reservationParserSince) }
	return parses(a) == parses(b)
}

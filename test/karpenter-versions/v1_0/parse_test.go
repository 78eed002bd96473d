// Package karpenter_test is the version matrix's column for Karpenter v1.0.8, the oldest v1
// the router serves: it has no parser for capacity-reservation interruptions, and deletes one
// forwarded to it as a no-op. It imports nothing of that release but its interruption
// message parsers.
package karpenter_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/rebalancerecommendation"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/scheduledchange"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/spotinterruption"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/statechange"

	"github.com/health-router/health-router/test/karpenter-versions/matrix"
)

// parsers are the release's interruption controller's parsers (its DefaultParsers).
var parsers = []messages.Parser{
	statechange.Parser{},
	spotinterruption.Parser{},
	scheduledchange.Parser{},
	rebalancerecommendation.Parser{},
}

// parse reads a body as the release's interruption controller does: the metadata, then the
// parser keyed by (version, source, detail-type); none is a no-op.
func parse(body []byte) matrix.Read {
	var md messages.Metadata
	if err := json.Unmarshal(body, &md); err != nil {
		return matrix.Read{Err: fmt.Errorf("unmarshalling the metadata: %w", err)}
	}
	for _, p := range parsers {
		if p.Version() != md.Version || p.Source() != md.Source || p.DetailType() != md.DetailType {
			continue
		}
		msg, err := p.Parse(string(body))
		if err != nil {
			return matrix.Read{Err: err}
		}
		if msg == nil {
			return matrix.Read{}
		}
		return matrix.Read{Parsed: true, Kind: string(msg.Kind()), Instances: msg.EC2InstanceIDs()}
	}
	return matrix.Read{}
}

func TestForwardedBodies(t *testing.T) { matrix.Check(t, parse) }

package record

import (
	"context"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The shadow ledger (router/shadow) outlives the NodeClaims it tells of: it is a HealthRecord
// of its own, named LedgerRecordName, with an empty spec and no owner (the NodeClaims it names
// are gone long before it is; handback removes it). Before the store it was a ConfigMap in the
// router's namespace, which anyone with `update configmaps` there could write.
const (
	// LedgerPrefix begins the ledger's name. A NodeClaim's name ends in a dash and five
	// characters Karpenter draws (generateName), so no NodeClaim's name is LedgerPrefix and a
	// name the chart gives (<release>-shadow).
	LedgerPrefix = "ledger."
	// LedgerMaxBytes bounds the ledger's memory: one object, read by `status --shadow` and
	// /shadow, far under etcd's 1.5 MiB. The ledger keeps its newest entries within it.
	LedgerMaxBytes = 512 << 10
	// ActionLedger is the ledger's Action in its Summary.
	ActionLedger = "shadow ledger"
)

// LedgerRecordName is the name of the HealthRecord that holds the ledger called name (the
// --shadow-ledger flag, <release>-shadow in the chart): LedgerPrefix and name, or a hash of
// name where that would pass an object name's 253 characters.
func LedgerRecordName(name string) string { return prefixedName(LedgerPrefix, name) }

// OfLedger reports whether h is the shadow ledger, not a NodeClaim's or a Node's record.
func (h *HealthRecord) OfLedger() bool {
	return h.Spec.NodeClaim == "" && h.Spec.NodeName == "" && strings.HasPrefix(h.Name, LedgerPrefix)
}

// LoadLedger reads the memory of the ledger called name through r (empty when there is none).
func LoadLedger(ctx context.Context, r client.Reader, name string) (Memory, bool, error) {
	hr := &HealthRecord{}
	if err := r.Get(ctx, client.ObjectKey{Name: LedgerRecordName(name)}, hr); err != nil {
		if client.IgnoreNotFound(err) == nil || isNoStore(err) {
			return Memory{}, false, nil
		}
		return Memory{}, false, err
	}
	m, err := hr.Memory()
	return m, true, err
}

// UpdateLedger is Update for the ledger called name, bounded at LedgerMaxBytes.
func (s *Store) UpdateLedger(ctx context.Context, name string, mutate func(*Memory) (bool, error)) error {
	build := func() *HealthRecord {
		return &HealthRecord{
			TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: Kind},
			ObjectMeta: metav1.ObjectMeta{Name: LedgerRecordName(name)},
		}
	}
	return s.update(ctx, LedgerRecordName(name), "the shadow ledger "+name, false, LedgerMaxBytes, build, nil, mutate)
}

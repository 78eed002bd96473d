package record

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// Store reads and writes the router's memory: one HealthRecord per NodeClaim. Reads go to
// kube (the informer's cache in the router), writes to the API server with an optimistic
// lock on the HealthRecord; a conflict reads fresh and tries again. Nothing on the NodeClaim
// itself (its annotations, which Karpenter, operators and anyone with `patch nodeclaims`
// write) is read as memory.
type Store struct {
	kube  client.Client
	fresh client.Reader
}

// NewStore returns the store over kube (reads and writes) and fresh (reads after a conflict).
func NewStore(kube client.Client, fresh client.Reader) *Store {
	return &Store{kube: kube, fresh: fresh}
}

// Get returns the memory of the NodeClaim named name, as the cache has it: nothing kept is
// an empty Memory. A record of a newer format is ErrUnreadable.
func (s *Store) Get(ctx context.Context, name string) (Memory, error) {
	return Load(ctx, s.kube, name)
}

// Fresh returns the memory as the API server has it now.
func (s *Store) Fresh(ctx context.Context, name string) (Memory, error) {
	return Load(ctx, s.fresh, name)
}

// Of returns the memory of nc (nil: empty), from the cache; an unreadable one is empty, for
// the readers that only count or show (callers that must tell the difference use Get).
func (s *Store) Of(ctx context.Context, nc *karpv1.NodeClaim) Memory {
	if nc == nil || s == nil {
		return Memory{}
	}
	m, _ := s.Get(ctx, nc.Name)
	return m
}

// Load reads the memory of the NodeClaim named name (or the HealthRecord so named: a Node's,
// NodeRecordName) through r (the store's readers, a
// model's cache, a command's client): nothing kept is an empty Memory.
func Load(ctx context.Context, r client.Reader, name string) (Memory, error) {
	hr := &HealthRecord{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, hr); err != nil {
		if apierrors.IsNotFound(err) || isNoStore(err) {
			return Memory{}, nil
		}
		return Memory{}, fmt.Errorf("reading healthrecord %s: %w", name, err)
	}
	return hr.Memory()
}

// isNoStore reports whether err says the API server does not serve HealthRecords (the CRD
// is not installed): nothing can have been kept.
func isNoStore(err error) bool { return meta.IsNoMatchError(err) }

// Memory returns h's memory (a copy); a newer format's is ErrUnreadable.
func (h *HealthRecord) Memory() (Memory, error) {
	if h.Status.Version > Version {
		return Memory{}, fmt.Errorf("%w: healthrecord %s: version %d (this router reads up to %d)", ErrUnreadable, h.Name, h.Status.Version, Version)
	}
	var m Memory
	h.Status.Memory.DeepCopyInto(&m)
	return m, nil
}

// Update applies mutate to the memory of nc and writes it: the HealthRecord is created on the
// first write, updated after (one request each, under its resource version), and deleted once
// the memory is empty (no state left
// behind). mutate returns false when there is nothing to change; its error ends the update.
// A memory of a newer format is not given to mutate: the update fails with ErrUnreadable.
func (s *Store) Update(ctx context.Context, nc *karpv1.NodeClaim, mutate func(*Memory) (bool, error)) error {
	return s.update(ctx, nc.Name, "nodeclaim "+nc.Name, false, MaxBytes, func() *HealthRecord { return newHealthRecord(nc) }, nil, mutate)
}

// update is Update of the HealthRecord named name (of what, for errors): read from the cache
// first unless fresh, its memory bounded at limit bytes, built by build when it is created; a
// record stale reports as another object's (a Node of the same name, gone) is deleted and its
// memory taken as empty.
func (s *Store) update(ctx context.Context, name, what string, fresh bool, limit int, build func() *HealthRecord, stale func(*HealthRecord) bool, mutate func(*Memory) (bool, error)) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var r client.Reader = s.kube
		if !first || fresh {
			r = s.fresh
		}
		first = false
		hr := &HealthRecord{}
		exists := true
		if err := r.Get(ctx, client.ObjectKey{Name: name}, hr); apierrors.IsNotFound(err) {
			exists = false
		} else if err != nil {
			return fmt.Errorf("reading the healthrecord of %s: %w", what, err)
		}
		if exists && stale != nil && stale(hr) {
			// Its spec is immutable: the record goes, and the write creates this object's.
			err := s.kube.Delete(ctx, hr, client.Preconditions{UID: ptr.To(hr.UID), ResourceVersion: ptr.To(hr.ResourceVersion)})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting the stale healthrecord %s: %w", name, err)
			}
			hr, exists = &HealthRecord{}, false
		}
		mem, err := hr.Memory()
		if err != nil {
			return err
		}
		if ok, err := mutate(&mem); err != nil || !ok {
			return err
		}
		mem.Records = Trim(mem.Records)
		if mem.Empty() {
			if !exists {
				return nil
			}
			// Nothing left to keep: the record goes, if no one wrote it since it was read.
			err := s.kube.Delete(ctx, hr, client.Preconditions{ResourceVersion: ptr.To(hr.ResourceVersion)})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		if b, err := json.Marshal(mem); err != nil {
			return fmt.Errorf("encoding the memory of %s: %w", what, err)
		} else if len(b) > limit {
			return fmt.Errorf("%w: %d bytes, %d records (bound %d bytes)", ErrTooLarge, len(b), len(mem.Records), limit)
		}
		// One request a write: the status is written with the object (the CRD has no status
		// subresource: the router is its only writer, and a create through the subresource
		// would drop the status, a second request for every first write).
		if !exists {
			hr = build()
			hr.Status = HealthRecordStatus{Version: Version, Memory: mem, Summary: Summarize(mem)}
			if err := s.kube.Create(ctx, hr); err != nil {
				if apierrors.IsAlreadyExists(err) {
					// Another writer created it first: read it and apply mutate to its memory.
					return apierrors.NewConflict(GroupVersion.WithResource(Resource).GroupResource(), name, err)
				}
				if apierrors.IsRequestEntityTooLargeError(err) {
					return fmt.Errorf("%w: %w", ErrTooLarge, err)
				}
				return fmt.Errorf("creating the healthrecord of %s: %w", what, err)
			}
			return nil
		}
		hr.Status = HealthRecordStatus{Version: Version, Memory: mem, Summary: Summarize(mem)}
		if err := s.kube.Update(ctx, hr); err != nil {
			if apierrors.IsRequestEntityTooLargeError(err) {
				return fmt.Errorf("%w: %w", ErrTooLarge, err)
			}
			return err
		}
		return nil
	})
}

// Delete removes the memory of the NodeClaim named name (its NodeClaim is gone). A record
// the cache does not hold costs no request: most NodeClaims have none.
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := s.kube.Get(ctx, client.ObjectKey{Name: name}, &HealthRecord{}); apierrors.IsNotFound(err) || isNoStore(err) {
		return nil
	}
	err := s.kube.Delete(ctx, &HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if apierrors.IsNotFound(err) || isNoStore(err) {
		return nil
	}
	return err
}

// newHealthRecord is the HealthRecord of nc, owned by it: the garbage collector removes it
// with the NodeClaim.
func newHealthRecord(nc *karpv1.NodeClaim) *HealthRecord {
	hr := &HealthRecord{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{Name: nc.Name, Labels: map[string]string{}},
		Spec:       HealthRecordSpec{NodeClaim: nc.Name, NodeName: nc.Status.NodeName, NodePool: nc.Labels[karpv1.NodePoolLabelKey]},
	}
	hr.Spec.InstanceID = instanceOfProvider(nc.Status.ProviderID)
	if pool := hr.Spec.NodePool; pool != "" {
		hr.Labels[karpv1.NodePoolLabelKey] = pool
	}
	if nc.UID != "" {
		hr.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "karpenter.sh/v1", Kind: "NodeClaim", Name: nc.Name, UID: nc.UID,
		}}
	}
	return hr
}

// ClaimEnds passes a NodeClaim's deletion beginning and its disappearance: the end of its
// HealthRecord (the controllers that watch HealthRecords watch NodeClaims through it).
func ClaimEnds() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(ctrlevent.CreateEvent) bool { return false },
		UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
		DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return true },
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	}
}

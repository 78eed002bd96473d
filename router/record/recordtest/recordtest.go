// Package recordtest reads and seeds the router's memory (router/record's HealthRecords) in
// tests, as the API server holds it.
package recordtest

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
)

// Memory is nc's memory as c reads it.
func Memory(t testing.TB, c client.Reader, nc *karpv1.NodeClaim) record.Memory {
	t.Helper()
	m, err := record.Load(context.Background(), c, nc.Name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Records is nc's records as c reads them.
func Records(t testing.TB, c client.Reader, nc *karpv1.NodeClaim) []record.Record {
	t.Helper()
	return Memory(t, c, nc).Records
}

// Set is nc's records as a Set.
func Set(t testing.TB, c client.Reader, nc *karpv1.NodeClaim) record.Set {
	t.Helper()
	return Memory(t, c, nc).Set()
}

// Seed writes mem as nc's memory, through the store as the router writes it.
func Seed(t testing.TB, c client.Client, nc *karpv1.NodeClaim, mem record.Memory) {
	t.Helper()
	if err := record.NewStore(c, c).Update(context.Background(), nc, func(m *record.Memory) (bool, error) {
		*m = mem
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// SeedNode writes mem as the memory of the Node n, through the store as the router writes it.
func SeedNode(t testing.TB, c client.Client, n *corev1.Node, mem record.Memory) {
	t.Helper()
	if err := record.NewStore(c, c).UpdateNode(context.Background(), n, func(m *record.Memory) (bool, error) {
		*m = mem
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// NodeMemory is the memory of the Node named node as c reads it.
func NodeMemory(t testing.TB, c client.Reader, node string) record.Memory {
	t.Helper()
	m, err := record.Load(context.Background(), c, record.NodeRecordName(node))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runAnnotation held a reboot in place's run on the NodeClaim before the store (router/inplace
// keeps the same key for the Node's part of a run).
const runAnnotation = record.AnnotationRun

// FromAnnotations moves the memory a test wrote on NodeClaims, in the keys routers before the
// store kept it in (record.Annotation, the drain-signalled stamp, the reboot in place's run), into HealthRecords, where
// the router keeps it now, and removes the keys. A value of a newer format becomes a
// HealthRecord of version 99. It lets a test describe a NodeClaim's memory beside it.
func FromAnnotations(t testing.TB, c client.Client) {
	t.Helper()
	var ncs karpv1.NodeClaimList
	if err := c.List(context.Background(), &ncs); err != nil {
		t.Fatal(err)
	}
	for i := range ncs.Items {
		nc := &ncs.Items[i]
		v, hasRecords := nc.Annotations[record.Annotation]
		stamp, hasStamp := nc.Annotations[record.AnnotationDrainSignalled]
		run, hasRun := nc.Annotations[runAnnotation]
		if !hasRecords && !hasStamp && !hasRun {
			continue
		}
		delete(nc.Annotations, record.Annotation)
		delete(nc.Annotations, record.AnnotationDrainSignalled)
		delete(nc.Annotations, runAnnotation)
		if err := c.Update(context.Background(), nc); err != nil {
			t.Fatal(err)
		}
		set, err := record.Decode(v)
		mem := record.Memory{Records: set.Records, Running: set.Running}
		if id, at, via, ok := record.ParseDrainStamp(stamp); ok {
			mem.Drain = &record.Drain{EventID: id, At: at, Via: via}
		}
		if hasRun {
			mem.Run = json.RawMessage(run)
		}
		if err != nil {
			mem = record.Memory{Records: []record.Record{{EventID: "from-a-newer-router"}}}
		}
		Seed(t, c, nc, mem)
		if err != nil {
			hr := &record.HealthRecord{}
			if err := c.Get(context.Background(), client.ObjectKey{Name: nc.Name}, hr); err != nil {
				t.Fatal(err)
			}
			hr.Status.Version = 99
			if err := c.Update(context.Background(), hr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

package gates

import (
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
)

// What the cache keeps of Pods and PDBs (see router/cluster/transform.go for Nodes): a Pod
// in a real cluster carries its containers, volumes, env, status.containerStatuses and
// managedFields (often 5-20 KiB); the gates and the watchdog read only who owns it, where
// it runs, its labels (PDB selectors), phase, readiness, deletion and the mirror
// annotation.

// TrimPod is the cache transform of Pods. It changes obj in place (the informer's own
// copy) and returns it.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	p.ManagedFields = nil
	var ann map[string]string
	if v, ok := p.Annotations[AnnotationMirror]; ok {
		ann = map[string]string{AnnotationMirror: v}
	}
	p.Annotations = ann
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName}
	var conds []corev1.PodCondition
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			conds = append(conds, corev1.PodCondition{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime})
		}
	}
	p.Status = corev1.PodStatus{Phase: p.Status.Phase, Conditions: conds}
	return p, nil
}

// TrimPDB is the cache transform of PodDisruptionBudgets: the selector, and the status
// fields the gate reports (disruptions allowed, healthy counts, the DisruptionAllowed
// condition for since when).
func TrimPDB(obj any) (any, error) {
	pdb, ok := obj.(*policyv1.PodDisruptionBudget)
	if !ok {
		return obj, nil
	}
	pdb.ManagedFields = nil
	pdb.Annotations = nil
	pdb.Labels = nil
	pdb.Spec = policyv1.PodDisruptionBudgetSpec{Selector: pdb.Spec.Selector}
	var conds = pdb.Status.Conditions[:0:0]
	for _, c := range pdb.Status.Conditions {
		if c.Type == policyv1.DisruptionAllowedCondition {
			c.Message = ""
			conds = append(conds, c)
		}
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{
		DisruptionsAllowed: pdb.Status.DisruptionsAllowed,
		CurrentHealthy:     pdb.Status.CurrentHealthy,
		DesiredHealthy:     pdb.Status.DesiredHealthy,
		Conditions:         conds,
	}
	return pdb, nil
}

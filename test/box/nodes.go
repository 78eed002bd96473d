package box

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/test/harness"
)

// nodeReadyTimeout bounds how long a kubelet kwok plays takes to report Ready: kwok reacts
// to the Node's watch event within a second.
const nodeReadyTimeout = time.Minute

// NodeSpec is a Node to register, as an EC2 instance's kubelet would.
type NodeSpec struct {
	// Name is the Node's name.
	Name string
	// InstanceID is the EC2 instance behind it; default: an ID derived from Name.
	InstanceID string
	// Zone is its availability zone; default: the suites' region's "a" zone.
	Zone string
	// InstanceType labels it (node.kubernetes.io/instance-type); default m5.xlarge.
	InstanceType string
	// Labels are added to the well-known ones the kubelet and the cloud provider set.
	Labels map[string]string
	// Taints it registers with.
	Taints []corev1.Taint
	// Capacity is what it reports (also its allocatable); default an m5.xlarge's: 4 CPUs,
	// 16Gi, 58 pods.
	Capacity corev1.ResourceList
}

// AddNode registers a Node as its kubelet would (spec, labels and status, with providerID
// aws:///ZONE/INSTANCE so the router maps it to its instance), starts its kubelet, and returns
// the Node once kwok reports it Ready and the node lifecycle controller knows it.
func (b *Box) AddNode(ctx context.Context, s NodeSpec) (*corev1.Node, error) {
	if s.InstanceID == "" {
		name := sha256.Sum256([]byte(s.Name))
		s.InstanceID = "i-" + hex.EncodeToString(name[:])[:17]
	}
	if s.Zone == "" {
		s.Zone = harness.Region + "a"
	}
	if s.InstanceType == "" {
		s.InstanceType = "m5.xlarge"
	}
	if s.Capacity == nil {
		s.Capacity = corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("4"),
			corev1.ResourceMemory: resource.MustParse("16Gi"),
			corev1.ResourcePods:   resource.MustParse("58"),
		}
	}
	labels := map[string]string{
		corev1.LabelHostname:           s.Name,
		corev1.LabelOSStable:           "linux",
		corev1.LabelArchStable:         "amd64",
		corev1.LabelTopologyZone:       s.Zone,
		corev1.LabelTopologyRegion:     harness.Region,
		corev1.LabelInstanceTypeStable: s.InstanceType,
	}
	maps.Copy(labels, s.Labels)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Labels: labels},
		Spec:       corev1.NodeSpec{ProviderID: fmt.Sprintf("aws:///%s/%s", s.Zone, s.InstanceID), Taints: s.Taints},
	}
	if err := b.client.Create(ctx, node); err != nil {
		return nil, fmt.Errorf("registering node %s: %w", s.Name, err)
	}
	// Its status, as the kubelet reports it on registering: what it has, where it is, and
	// what it runs (the boot ID a reboot changes). Retried: the node lifecycle controller
	// taints a new Node at once.
	sum := sha256.Sum256([]byte(s.InstanceID))
	status := corev1.NodeStatus{
		Capacity:    s.Capacity,
		Allocatable: s.Capacity,
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("172.16.%d.%d", sum[0], 1+int(sum[1])%254)},
			{Type: corev1.NodeHostName, Address: s.Name},
		},
		NodeInfo: corev1.NodeSystemInfo{
			BootID:                  newBootID(),
			MachineID:               s.InstanceID,
			SystemUUID:              s.InstanceID,
			KubeletVersion:          kubeletVersion(),
			KubeProxyVersion:        kubeletVersion(),
			ContainerRuntimeVersion: "kwok",
			OperatingSystem:         "linux",
			Architecture:            "amd64",
			OSImage:                 "box",
			KernelVersion:           "box",
		},
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := b.client.Get(ctx, client.ObjectKey{Name: s.Name}, node); err != nil {
			return err
		}
		node.Status = status
		return b.client.Status().Update(ctx, node)
	})
	if err != nil {
		return nil, fmt.Errorf("reporting node %s's status: %w", s.Name, err)
	}
	if err := b.startKubelet(ctx, s.Name); err != nil {
		return nil, err
	}
	return b.waitReady(ctx, s.Name, true)
}

// SetNotReady stops the Node's kubelet, as a node that hangs or powers off: kwok stops
// renewing its lease and playing its pods. Its status stays as last reported until the node
// lifecycle controller finds the lease stale (--node-monitor-grace-period, 50 s): then it
// sets the Node Unknown, taints it not-ready/unreachable and marks its pods not ready, as in
// a cluster. (A kubelet that reported Ready=False itself would be trusted to mind its pods,
// and the controller would mark none.)
func (b *Box) SetNotReady(ctx context.Context, name string) error {
	return b.setKubeletLabel(ctx, name, nil)
}

// SetReady starts the Node's kubelet again with the same boot (a hung kubelet back, a
// partition healed): pods the node lifecycle controller marked not ready are ready again. It
// returns the Node once kwok reports it Ready and the node lifecycle controller has lifted its
// not-ready taints.
func (b *Box) SetReady(ctx context.Context, name string) (*corev1.Node, error) {
	if err := b.startKubelet(ctx, name); err != nil {
		return nil, err
	}
	return b.waitReady(ctx, name, false)
}

// Reboot reboots the Node: its kubelet stops (if it runs) and stays down for down, then the
// node comes back with a new boot ID and its pods' containers stopped, which the kubelet
// starts again (their restart counts raised, after each pod's start delay). A reboot shorter
// than the node lifecycle controller's grace period goes unseen by the control plane, as in
// a cluster, but for the boot ID and the restarts. It returns the Node as SetReady does.
func (b *Box) Reboot(ctx context.Context, name string, down time.Duration) (*corev1.Node, error) {
	node := &corev1.Node{}
	if err := b.client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return nil, err
	}
	if node.Labels[LabelKubelet] != "" {
		if err := b.SetNotReady(ctx, name); err != nil {
			return nil, err
		}
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(down):
	}
	// While kwok does not play the Node, the box speaks for its kubelet starting after the
	// boot: the new boot ID, and every container of its running pods stopped.
	boot := newBootID()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := b.client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			return err
		}
		node.Status.NodeInfo.BootID = boot
		return b.client.Status().Update(ctx, node)
	})
	if err != nil {
		return nil, fmt.Errorf("reporting node %s's new boot: %w", name, err)
	}
	if err := b.stopContainers(ctx, name); err != nil {
		return nil, err
	}
	return b.SetReady(ctx, name)
}

// stopContainers reports every container of the Node's running pods stopped and the pods not
// ready, as the kubelet does on starting after a reboot, before it starts them again.
func (b *Box) stopContainers(ctx context.Context, name string) error {
	pods := &corev1.PodList{}
	if err := b.client.List(ctx, pods, client.MatchingFields{"spec.nodeName": name}); err != nil {
		return fmt.Errorf("listing node %s's pods: %w", name, err)
	}
	for i := range pods.Items {
		key := client.ObjectKeyFromObject(&pods.Items[i])
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pod := &corev1.Pod{}
			if err := b.client.Get(ctx, key, pod); err != nil {
				return err
			}
			if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
				return nil
			}
			now := metav1.Now()
			for _, t := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
				setPodCondition(pod, corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: "ContainersNotReady",
					Message: "node rebooted (test/box)", LastTransitionTime: now})
			}
			for j := range pod.Status.ContainerStatuses {
				cs := &pod.Status.ContainerStatuses[j]
				cs.Ready, cs.Started = false, ptr.To(false)
				cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
			}
			return b.client.Status().Update(ctx, pod)
		})
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("stopping pod %s's containers: %w", key, err)
		}
	}
	return nil
}

// startKubelet labels the Node for kwok.
func (b *Box) startKubelet(ctx context.Context, name string) error {
	v := "kwok"
	return b.setKubeletLabel(ctx, name, &v)
}

// setKubeletLabel sets LabelKubelet to *v, or removes it if v is nil.
func (b *Box) setKubeletLabel(ctx context.Context, name string, v *string) error {
	value := "null"
	if v != nil {
		value = fmt.Sprintf("%q", *v)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, LabelKubelet, value)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := b.client.Patch(ctx, node, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return fmt.Errorf("labelling node %s for its kubelet: %w", name, err)
	}
	return nil
}

// waitReady waits until the Node's kubelet reports Ready and the node lifecycle controller
// has seen it so: the not-ready and unreachable NoExecute taints it puts on a Node it saw not
// ready are gone. With registered, also until the controller has registered the Node (its
// RegisteredNode Event): a Node the controller has not seen yet would look never ready to it,
// and stopping its kubelet would not be a change it acts on (no pods marked not ready).
func (b *Box) waitReady(ctx context.Context, name string, registered bool) (*corev1.Node, error) {
	node := &corev1.Node{}
	var state string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, nodeReadyTimeout, true, func(ctx context.Context) (bool, error) {
		if err := b.client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			return false, err
		}
		if !Ready(node) {
			state = "not Ready"
			return false, nil
		}
		for _, t := range node.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoExecute && (t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable) {
				state = "Ready, still tainted " + t.Key
				return false, nil
			}
		}
		if !registered {
			return true, nil
		}
		events := &corev1.EventList{}
		if err := b.client.List(ctx, events, client.MatchingFields{"involvedObject.kind": "Node", "involvedObject.name": name, "reason": "RegisteredNode"}); err != nil {
			return false, err
		}
		state = "Ready, not yet registered by the node lifecycle controller"
		return len(events.Items) > 0, nil
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: %s after %s (kwok's log: %s): %w", name, state, nodeReadyTimeout, filepath.Join(b.dir, "kwok.log"), err)
	}
	return node, nil
}

// Ready reports whether a Node's Ready condition is True.
func Ready(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// setPodCondition replaces the condition of c's type, or adds it.
func setPodCondition(pod *corev1.Pod, c corev1.PodCondition) {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == c.Type {
			pod.Status.Conditions[i] = c
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, c)
}

// newBootID returns a new boot ID, a UUID as a kubelet reports it.
func newBootID() string { return string(uuid.NewUUID()) }

// kubeletVersion is the version the box's kubelets report: the release of the control plane
// (test/tools' K8S_VERSION).
func kubeletVersion() string {
	if v := os.Getenv("K8S_VERSION"); v != "" {
		return "v" + v
	}
	return "v1.37.0"
}

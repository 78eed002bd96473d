package box

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/test/harness"
)

// registerEvery is how often the box looks for instances Karpenter launched that have no Node
// yet: an instance's kubelet registers within seconds of its boot.
const registerEvery = 500 * time.Millisecond

// StartKarpenter runs the real Karpenter (the AWS provider's controller, built by
// test/tools/karpenter-bin.sh) in the box: on the box's API server, launching instances
// through moto_server (harness.KarpenterStage: its interruption queue, the EC2NodeClass
// "default"), and plays each launched instance's kubelet: once Karpenter has launched a
// NodeClaim's instance, the box registers its Node (the NodeClaim's labels, its taints and
// startup taints beside karpenter.sh/unregistered, the capacity Karpenter computed) and kwok
// plays it from then on. So a workload's pending pods bring up nodes as in a cluster: the
// scheduler finds no room, Karpenter's provisioner makes a NodeClaim, its instance joins, the
// scheduler binds the pods and kwok runs them; and a NodeClaim Karpenter deletes is drained by
// its termination controller, its pods evicted under their budgets. It is stopped with the box.
func (b *Box) StartKarpenter(ctx context.Context) (*harness.KarpenterStage, error) {
	bin, err := tool(ctx, "KARPENTER_BIN", "karpenter-bin.sh")
	if err != nil {
		return nil, err
	}
	started := time.Now()
	stage, err := harness.StartKarpenterStageWith(ctx, bin, b.dir, harness.KarpenterStageOptions{Env: b.env})
	if err != nil {
		return nil, fmt.Errorf("starting Karpenter in the box: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &registrar{box: b, started: map[string]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(rctx)
	}()
	b.stops = append(b.stops, func() error {
		cancel()
		<-done
		stage.Stop()
		return r.err()
	})
	b.log.Info("box: Karpenter up", "took", time.Since(started).Round(time.Millisecond), "log", stage.Log)
	return stage, nil
}

// registrar plays the kubelet of every instance Karpenter launches: it registers the Node.
type registrar struct {
	box *Box

	mu      sync.Mutex
	started map[string]bool // NodeClaims whose Node is registered or being registered
	errs    []error
}

// run registers the Nodes of launched NodeClaims until ctx ends.
func (r *registrar) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(registerEvery)
	defer t.Stop()
	for {
		var claims karpv1.NodeClaimList
		if err := r.box.client.List(ctx, &claims); err != nil && ctx.Err() == nil {
			r.fail(fmt.Errorf("listing nodeclaims: %w", err))
		}
		for i := range claims.Items {
			nc := &claims.Items[i]
			if nc.Status.ProviderID == "" || !nc.DeletionTimestamp.IsZero() || r.begin(nc.Name) {
				continue
			}
			wg.Go(func() {
				if err := r.register(ctx, nc); err != nil && ctx.Err() == nil {
					r.fail(err)
				}
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// begin reports whether the NodeClaim's Node was begun already, and marks it begun.
func (r *registrar) begin(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started[name] {
		return true
	}
	r.started[name] = true
	return false
}

func (r *registrar) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.box.log.Error("box: registering a node Karpenter launched", "error", err)
	r.errs = append(r.errs, err)
}

func (r *registrar) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.errs...)
}

// register registers nc's Node as its instance's kubelet would on boot.
func (r *registrar) register(ctx context.Context, nc *karpv1.NodeClaim) error {
	spec, err := KarpenterNode(nc)
	if err != nil {
		return err
	}
	if _, err := r.box.AddNode(ctx, spec); err != nil && !apierrors.IsAlreadyExists(errors.Unwrap(err)) {
		return fmt.Errorf("nodeclaim %s: %w", nc.Name, err)
	}
	return nil
}

// KarpenterNode is the Node a launched NodeClaim's instance registers, named ip-<instance> as
// the stage's nodes are: what Karpenter's user data has the kubelet register with (the
// NodeClaim's labels, its taints and startup taints, and karpenter.sh/unregistered, which
// Karpenter removes once it has synced the Node), in the NodeClaim's zone, reporting the
// capacity Karpenter computed for the instance type.
func KarpenterNode(nc *karpv1.NodeClaim) (NodeSpec, error) {
	pid := nc.Status.ProviderID // aws:///<zone>/<instance>
	parts := strings.Split(strings.TrimPrefix(pid, "aws:///"), "/")
	if !strings.HasPrefix(pid, "aws:///") || len(parts) != 2 || !strings.HasPrefix(parts[1], "i-") {
		return NodeSpec{}, fmt.Errorf("nodeclaim %s: provider ID %q is not aws:///<zone>/<instance>", nc.Name, pid)
	}
	taints := append(append([]corev1.Taint{}, nc.Spec.Taints...), nc.Spec.StartupTaints...)
	taints = append(taints, karpv1.UnregisteredNoExecuteTaint)
	return NodeSpec{
		Name:         "ip-" + parts[1],
		InstanceID:   parts[1],
		Zone:         parts[0],
		InstanceType: nc.Labels[corev1.LabelInstanceTypeStable],
		Labels:       nc.Labels,
		Taints:       taints,
		Capacity:     nc.Status.Allocatable,
	}, nil
}

// NodeOf returns the name of the Node a NodeClaim Karpenter launched registers as.
func NodeOf(nc *karpv1.NodeClaim) string {
	spec, err := KarpenterNode(nc)
	if err != nil {
		return ""
	}
	return spec.Name
}

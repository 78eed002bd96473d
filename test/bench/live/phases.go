package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/test/bench/realistic"
)

// live is what the phases run with the router binary need.
type live struct {
	bin, kubeconfig, dlqURL, motoURL string
	sqs                              *sqs.Client
	kube                             client.Client
	obs                              *outcomes
}

func newLive(ctx context.Context, env *envtest.Environment, root, dir string, sqsc *sqs.Client, kube client.Client, obs *outcomes, dlqURL, motoURL string) (*live, error) {
	progress("building the router binary")
	bin, err := buildRouter(root, dir)
	if err != nil {
		return nil, err
	}
	user, err := env.AddUser(envtest.User{Name: "health-router", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding the router's user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return nil, err
	}
	return &live{bin: bin, kubeconfig: path, dlqURL: dlqURL, motoURL: motoURL, sqs: sqsc, kube: kube, obs: obs}, nil
}

func (l *live) start(ctx context.Context, queue string, f flags) (*routerProc, string, error) {
	url, err := createQueue(ctx, l.sqs, queue)
	if err != nil {
		return nil, "", err
	}
	p, err := startRouter(ctx, l.bin, l.kubeconfig, url, l.dlqURL, l.motoURL, f)
	return p, url, err
}

// weighLive runs the binary against the cluster as it is and reads its RSS and heap once its
// cache holds every node.
func (b *bench) weighLive(ctx context.Context, l *live, nodes int) error {
	progress("router binary: weighing it with %d nodes cached", nodes)
	p, _, err := l.start(ctx, fmt.Sprintf("idle-%d", nodes), b.f)
	if err != nil {
		return err
	}
	defer p.kill()
	rss, heap := p.weigh()
	b.add(fmt.Sprintf("router binary, %d realistic nodes cached: RSS / Go heap", nodes),
		fmt.Sprintf("%.0f MiB / %.0f MiB (%.1f KiB heap per node, process included)", float64(rss)/(1<<20), float64(heap)/(1<<20), float64(heap)/1024/float64(nodes)), "")
	return nil
}

// send sends bodies to queue together and waits until every instance of claims has an
// outcome of one of eventIDs; it returns the time from the send.
func (l *live) send(ctx context.Context, queue string, bodies, eventIDs, claims []string, done <-chan error) (time.Duration, error) {
	l.obs.expect(eventIDs, claims, nil)
	t0 := time.Now()
	for _, body := range bodies {
		if _, err := l.sqs.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(body)}); err != nil {
			return 0, fmt.Errorf("sending a Health event: %w", err)
		}
	}
	return l.wait(ctx, t0, len(claims), done)
}

func (l *live) wait(ctx context.Context, t0 time.Time, n int, done <-chan error) (time.Duration, error) {
	l.obs.mu.Lock()
	all := l.obs.onAll
	l.obs.mu.Unlock()
	select {
	case <-all:
	case <-ctx.Done():
		return 0, fmt.Errorf("not carried out before the bench's timeout (%d of %d recorded)", l.obs.recordedCount(), n)
	case err := <-done:
		return 0, fmt.Errorf("the router stopped: %v", err)
	}
	l.obs.mu.Lock()
	defer l.obs.mu.Unlock()
	return l.obs.allAt.Sub(t0), nil
}

// scale grows the cluster to liveNodes with nodes of the defer pool, weighs the binary, then
// compares one Health event with five arriving together, and interrupts one mid-way.
func (b *bench) scale(ctx context.Context, l *live, uids map[string]types.UID, have int, deferClaims, deferIDs []string, oneEvent time.Duration, now time.Time) error {
	if add := b.f.liveNodes - have; add > 0 {
		progress("growing the cluster by %d nodes of the defer pool to %d", add, b.f.liveNodes)
		offset := 2 << 20
		t0 := time.Now()
		if err := createNodes(ctx, l.kube, offset, offset+add, 8, func(int) (string, types.UID) { return poolDefer, uids[poolDefer] }, true, now); err != nil {
			return err
		}
		progress("grown in %s", time.Since(t0).Round(time.Second))
		for i := offset; i < offset+add; i++ {
			deferClaims = append(deferClaims, realistic.ClaimName(poolDefer, i))
			deferIDs = append(deferIDs, realistic.InstanceID(i))
		}
		have += add
	}
	p, queue, err := l.start(ctx, "intake-scale", b.f)
	if err != nil {
		return err
	}
	defer func() {
		if p != nil {
			p.kill()
		}
	}()
	rss, heap := p.weigh()
	b.add(fmt.Sprintf("router binary, %d realistic nodes cached: RSS / Go heap", have),
		fmt.Sprintf("%.0f MiB / %.0f MiB (%.1f KiB heap per node, process included)", float64(rss)/(1<<20), float64(heap)/(1<<20), float64(heap)/1024/float64(have)), "")

	// One event of perEvent instances of the defer pool, then five together over the pool.
	k := min(b.f.perEvent, len(deferIDs))
	bodies, ids := healthEvents(deferIDs[:k], b.f.perEvent, now, 1, 5)
	progress("binary: one Health event naming %d instances of the defer pool", k)
	one, err := l.send(ctx, queue, bodies, ids, deferClaims[:k], p.done)
	if err != nil {
		return fmt.Errorf("one event: %w", err)
	}
	b.add(fmt.Sprintf("binary, %d nodes cached: one event naming %d defer-pool instances, send until recorded", have, k),
		fmt.Sprintf("%s (%.2f ms per instance)", one.Round(10*time.Millisecond), one.Seconds()*1000/float64(k)), "")
	// An interrupted bulk event: kill the router when 40% is recorded, start it again.
	bodies, ids = healthEvents(deferIDs[:k], b.f.perEvent, now, 3, 7)
	progress("binary: one Health event of %d instances, the router killed at 40%% and started again", k)
	l.obs.expect(ids, deferClaims[:k], nil)
	t0 := time.Now()
	for _, body := range bodies {
		if _, err := l.sqs.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(body)}); err != nil {
			return err
		}
	}
	for l.obs.recordedCount() < k*2/5 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	p.kill()
	time.Sleep(time.Second) // let the watch show the last writes
	before := l.obs.recordedCount()
	// What the killed router recorded: the restarted one must not write those records again.
	kept, err := recordsOf(ctx, l.kube, l.obs.recordedClaims())
	if err != nil {
		return err
	}
	progress("binary: killed with %d of %d recorded; starting it again", before, k)
	p, err = startRouter(ctx, l.bin, l.kubeconfig, queue, l.dlqURL, l.motoURL, b.f)
	if err != nil {
		return err
	}
	took, err := l.wait(ctx, t0, k, p.done)
	if err != nil {
		return fmt.Errorf("resumed event: %w", err)
	}
	skipped, _ := p.metric(metrics.AlreadyRecorded)
	// Every PATCH of the restarted binary: its NodeClaim records, and also the Nodes' marks and
	// Event series (the metric has no resource label), so it is reported, not bounded.
	patches, _ := p.metric("rest_client_requests_total", `method="PATCH"`)
	after, err := recordsOf(ctx, l.kube, l.obs.recordedClaims())
	if err != nil {
		return err
	}
	rewritten := 0
	for c, v := range kept {
		if after[c] != v {
			rewritten++
		}
	}
	b.add(fmt.Sprintf("interrupted event (%d instances): killed at %d recorded, restarted; skipped as recorded / records of those written again / PATCH requests after restart (NodeClaims, Nodes' marks, Events)", k, before),
		fmt.Sprintf("%.0f skipped / %d rewritten / %.0f; all %d recorded %s after the send (visibility timeout 10 s included)", skipped, rewritten, patches, k, took.Round(100*time.Millisecond)),
		fmt.Sprintf("≥ %d skipped, 0 rewritten", before))
	if int(skipped) < before {
		b.fail("after the restart only %.0f instances were skipped as recorded, %d were recorded before", skipped, before)
	}
	if rewritten > 0 {
		b.fail("after the restart the router wrote again the records of %d of the %d NodeClaims recorded before the kill", rewritten, len(kept))
	}
	total := min(5*b.f.perEvent, len(deferIDs))
	per := (total + 4) / 5
	bodies, ids = healthEvents(deferIDs[:total], per, now, 2, 6)
	progress("binary: %d Health events naming %d instances, sent together", len(bodies), total)
	five, err := l.send(ctx, queue, bodies, ids, deferClaims[:total], p.done)
	if err != nil {
		return fmt.Errorf("five events: %w", err)
	}
	ratio := (one.Seconds() / float64(k)) / (five.Seconds() / float64(total))
	b.add(fmt.Sprintf("binary: %d events of %d arriving together (%d instances), send until recorded", len(bodies), per, total),
		fmt.Sprintf("%s (%.2f ms per instance; %.2f× the speed per instance of one event)", five.Round(10*time.Millisecond), five.Seconds()*1000/float64(total), ratio), "≥ 1.0×, no slower per instance")
	if oneEvent > 0 {
		_ = oneEvent
	}

	return nil
}

// recordsOf reads the records annotation of each NodeClaim.
func recordsOf(ctx context.Context, kube client.Client, claims []string) (map[string]string, error) {
	out := make(map[string]string, len(claims))
	for _, c := range claims {
		var nc karpv1.NodeClaim
		if err := kube.Get(ctx, client.ObjectKey{Name: c}, &nc); err != nil {
			return nil, fmt.Errorf("reading NodeClaim %s: %w", c, err)
		}
		out[c] = nc.Annotations[record.Annotation]
	}
	return out, nil
}

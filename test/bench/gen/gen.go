// Package gen generates synthetic clusters and event bursts for the load harness and the
// benchmarks: N nodes and NodeClaims over P NodePools with mixed policies, C EC2NodeClasses
// sharing a multi-image alias, capacity reservations, and EventBridge bodies of every kind.
package gen

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
)

// Cluster is a generated cluster.
type Cluster struct {
	objs         []client.Object
	images       map[string]string
	reservations map[string]int32
}

// Objects returns the cluster's objects.
func (c *Cluster) Objects() []client.Object { return c.objs }

// Images returns image ID -> state.
func (c *Cluster) Images() map[string]string { return c.images }

// Reservations returns reservation ID -> available instances.
func (c *Cluster) Reservations() map[string]int32 { return c.reservations }

// Instance returns the instance ID of node i.
func Instance(i int) string { return fmt.Sprintf("i-0%016x", 0xbe00000000000+i) }

// policies cycle over the pools: Karpenter's default, a stateful pool with a window and
// pacing, an ignore pool, and a pool that ignores reboots with percentage pacing.
var policies = []map[string]string{
	nil,
	{"healthrouter.io/action": "defer", "healthrouter.io/window-schedule": "0 2 * * 6", "healthrouter.io/window-duration": "4h", "healthrouter.io/max-concurrent-drains": "1", "healthrouter.io/drain-lead": "2h"},
	{"healthrouter.io/action": "ignore"},
	{"healthrouter.io/action.scheduled-change.instance-reboot": "ignore", "healthrouter.io/action.scheduled-change.system-reboot": "ignore", "healthrouter.io/max-concurrent-drains": "10%"},
}

func req(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
}

// NewCluster generates a cluster.
func NewCluster(nodes, pools, classes, reservations int, seed uint64) *Cluster {
	c := &Cluster{images: map[string]string{}, reservations: map[string]int32{}}
	amis := []awsv1.AMI{
		{ID: "ami-0a00000000000nv86", Requirements: []corev1.NodeSelectorRequirement{req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpExists)}},
		{ID: "ami-0a00000000000nvar", Requirements: []corev1.NodeSelectorRequirement{req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "arm64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpExists)}},
		{ID: "ami-0a00000000000std86", Requirements: []corev1.NodeSelectorRequirement{req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpDoesNotExist)}},
		{ID: "ami-0a00000000000stdar", Requirements: []corev1.NodeSelectorRequirement{req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "arm64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpDoesNotExist)}},
	}
	for _, a := range amis {
		c.images[a.ID] = "available"
	}
	for k := 0; k < classes; k++ {
		c.objs = append(c.objs, &awsv1.EC2NodeClass{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("class-%d", k)}, Status: awsv1.EC2NodeClassStatus{AMIs: amis}})
	}
	for p := 0; p < pools; p++ {
		c.objs = append(c.objs, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pool-%d", p), Annotations: policies[p%len(policies)]}})
	}
	var rsv []string
	for r := 0; r < reservations; r++ {
		id := fmt.Sprintf("cr-0%016x", 0xc0000000+r)
		rsv = append(rsv, id)
		c.reservations[id] = 50
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	types := []string{"m7i.2xlarge", "m7g.2xlarge", "r7i.4xlarge", "c7g.4xlarge", "g5.2xlarge"}
	for i := 0; i < nodes; i++ {
		arch := []string{"amd64", "arm64"}[i%2]
		pool := fmt.Sprintf("pool-%d", i%pools)
		zone := []string{"eu-west-1a", "eu-west-1b", "eu-west-1c"}[rng.IntN(3)]
		labels := map[string]string{
			karpv1.NodePoolLabelKey: pool, corev1.LabelArchStable: arch, corev1.LabelOSStable: "linux",
			corev1.LabelInstanceTypeStable: types[rng.IntN(len(types))], corev1.LabelTopologyZone: zone,
			karpv1.CapacityTypeLabelKey:      []string{"on-demand", "spot"}[rng.IntN(2)],
			"karpenter.k8s.aws/ec2nodeclass": fmt.Sprintf("class-%d", i%classes),
		}
		if i%10 == 0 {
			labels[awsv1.LabelInstanceGPUCount] = "1"
		}
		if len(rsv) > 0 && i%7 == 0 {
			labels[karpv1.CapacityTypeLabelKey] = karpv1.CapacityTypeReserved
			labels[awsv1.LabelCapacityReservationID] = rsv[i%len(rsv)]
		}
		pid := fmt.Sprintf("aws:///%s/%s", zone, Instance(i))
		c.objs = append(c.objs,
			&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%06d", pool, i), Labels: labels},
				Spec:   karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: fmt.Sprintf("class-%d", i%classes)}},
				Status: karpv1.NodeClaimStatus{ProviderID: pid, NodeName: fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", i/65536, (i/256)%256, i%256)}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", i/65536, (i/256)%256, i%256), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid}},
		)
	}
	return c
}

func envelope(id, source, detailType string, t time.Time, resources []string, detail any) string {
	b, _ := json.Marshal(map[string]any{"version": "0", "id": id, "detail-type": detailType, "source": source, "account": "111122223333",
		"time": t.UTC().Format(time.RFC3339), "region": "eu-west-1", "resources": resources, "detail": detail})
	return string(b)
}

func instanceBody(id, detailType string, t time.Time, inst string, extra map[string]string) string {
	d := map[string]string{"instance-id": inst}
	for k, v := range extra {
		d[k] = v
	}
	return envelope(id, "aws.ec2", detailType, t, []string{"arn:aws:ec2:eu-west-1:111122223333:instance/" + inst}, d)
}

// HealthBody is an AWS Health scheduled-change body naming instances.
func HealthBody(id, code string, t, start time.Time, insts []string) string {
	var ents []map[string]any
	for _, i := range insts {
		ents = append(ents, map[string]any{"entityValue": i})
	}
	return envelope(id, "aws.health", "AWS Health Event", t, insts, map[string]any{
		"eventArn": "arn:aws:health:eu-west-1::event/EC2/" + code + "/" + id, "service": "EC2", "eventTypeCode": code,
		"eventTypeCategory": "scheduledChange", "statusCode": "upcoming", "startTime": start.UTC().Format(time.RFC1123), "affectedEntities": ents,
	})
}

var codes = []string{"AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED", "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED", "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", "AWS_EC2_INSTANCE_STOP_SCHEDULED", "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED"}

// MixedBodies returns n bodies of every kind, about a fifth of them duplicates of an earlier
// one; with scheduled false it leaves out the kinds that defer (for a burst that drains).
func MixedBodies(n, nodes int, now time.Time, seed uint64, scheduled bool) []string {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b9))
	out := make([]string, 0, n)
	for len(out) < n {
		if len(out) > 10 && rng.IntN(5) == 0 {
			out = append(out, out[rng.IntN(len(out))]) // a duplicate delivery
			continue
		}
		id := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rng.Uint32(), rng.IntN(65536), rng.IntN(4096), rng.IntN(4096), rng.Uint64()&0xffffffffffff)
		inst := Instance(rng.IntN(nodes + nodes/20)) // about 5% name no node of the cluster
		k := rng.IntN(10)
		if !scheduled && k < 3 {
			k = 3 + rng.IntN(7)
		}
		switch k {
		case 0, 1, 2:
			insts := []string{inst}
			for j := rng.IntN(3); j > 0; j-- {
				insts = append(insts, Instance(rng.IntN(nodes)))
			}
			out = append(out, HealthBody(id, codes[rng.IntN(len(codes))], now.Add(-time.Hour), now.Add(time.Duration(24+rng.IntN(400))*time.Hour), insts))
		case 3, 4, 5:
			out = append(out, instanceBody(id, "EC2 Spot Instance Interruption Warning", now, inst, map[string]string{"instance-action": "terminate"}))
		case 6, 7:
			out = append(out, instanceBody(id, "EC2 Instance Rebalance Recommendation", now, inst, nil))
		case 8:
			out = append(out, instanceBody(id, "EC2 Instance State-change Notification", now, inst, map[string]string{"state": []string{"running", "pending", "terminated"}[rng.IntN(3)]}))
		default:
			if rng.IntN(3) == 0 {
				out = append(out, `{"not":"an event"`) // poison
			} else {
				out = append(out, instanceBody(id, "EC2 Capacity Reservation Instance Interruption Warning", now, inst, map[string]string{"instance-action": "terminate"}))
			}
		}
	}
	return out
}

// MixedEvents parses MixedBodies (with every kind), leaving out what does not parse.
func MixedEvents(n, nodes int, now time.Time, seed uint64) []event.Event {
	var evs []event.Event
	for _, b := range MixedBodies(n, nodes, now, seed, true) {
		if ev, err := event.Parse([]byte(b)); err == nil {
			evs = append(evs, ev)
		}
	}
	return evs
}

// AZWideHealth is an AZ-wide maintenance naming every instance of the cluster, as AWS
// Health delivers it: split into events of at most perEvent instances, since an EventBridge
// event is at most 256 KiB (about 4,000 instance IDs).
func AZWideHealth(nodes, perEvent int, now time.Time) []event.Event {
	var evs []event.Event
	for start := 0; start < nodes; start += perEvent {
		var insts []string
		for i := start; i < min(start+perEvent, nodes); i++ {
			insts = append(insts, Instance(i))
		}
		id := fmt.Sprintf("a2f0c1d2-0000-4000-8000-%012d", start)
		ev, err := event.Parse([]byte(HealthBody(id, "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED", now, now.Add(96*time.Hour), insts)))
		if err != nil {
			panic(err) // the generator's own output
		}
		evs = append(evs, ev)
	}
	return evs
}

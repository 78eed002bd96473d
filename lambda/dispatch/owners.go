package dispatch

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"golang.org/x/sync/singleflight"
	"k8s.io/utils/clock"
)

const (
	// OwnerTTL is how long an instance's cluster is remembered. An instance never changes
	// cluster, so this only bounds memory and lets a re-tagged instance be seen eventually; a
	// warm Lambda sees a Spot warning, then the state changes, of the same instances within
	// minutes, and caching them saves a DescribeInstances call per event.
	OwnerTTL = 30 * time.Minute
	// UnownedTTL is how long "no cluster owns this instance" is remembered: short, because a
	// node's tags can lag its launch, but long enough to absorb a burst of events for the same
	// unowned instances.
	UnownedTTL = time.Minute

	// describeChunk is the most values one DescribeInstances filter accepts.
	describeChunk = 200
)

// Tag keys that name an instance's EKS cluster, in the order they are trusted.
const (
	tagKarpenterCluster = "eks:eks-cluster-name"   // Karpenter-launched nodes
	tagNodeGroupCluster = "eks:cluster-name"       // EKS managed node groups
	tagClusterPrefix    = "kubernetes.io/cluster/" // kubernetes.io/cluster/<name> = owned|shared
)

// instancesAPI is the part of EC2 the owner lookup uses.
type instancesAPI interface {
	DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

type ownerEntry struct {
	cluster string
	expires time.Time
}

// OwnerCache finds instances' clusters from their tags with batched DescribeInstances calls,
// remembering the answers.
type OwnerCache struct {
	ec2   instancesAPI
	clock clock.PassiveClock
	group singleflight.Group

	mu      sync.Mutex
	entries map[string]ownerEntry
}

// NewOwnerCache returns an OwnerCache that asks ec2 and reads the time from clk.
func NewOwnerCache(ec2 instancesAPI, clk clock.PassiveClock) *OwnerCache {
	return &OwnerCache{ec2: ec2, clock: clk, entries: map[string]ownerEntry{}}
}

// Owners returns the cluster of each of ids, "" for an instance no cluster tag names or that
// EC2 does not know. All instances not in the cache are described in one (paginated) call.
func (c *OwnerCache) Owners(ctx context.Context, ids []string) (map[string]string, error) {
	owners := make(map[string]string, len(ids))
	var missing []string
	now := c.clock.Now()
	c.mu.Lock()
	for _, id := range ids {
		if e, ok := c.entries[id]; ok && now.Before(e.expires) {
			owners[id] = e.cluster
			continue
		}
		missing = append(missing, id)
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return owners, nil
	}

	slices.Sort(missing)
	missing = slices.Compact(missing)
	// Concurrent invocations for the same instances (a burst of one Health event's updates)
	// share one call.
	v, err, _ := c.group.Do(strings.Join(missing, ","), func() (any, error) {
		return c.describe(ctx, missing)
	})
	if err != nil {
		return nil, err
	}
	found := v.(map[string]string)

	now = c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range missing {
		cluster := found[id]
		ttl := OwnerTTL
		if cluster == "" {
			ttl = UnownedTTL
		}
		c.entries[id] = ownerEntry{cluster: cluster, expires: now.Add(ttl)}
		owners[id] = cluster
	}
	c.evictExpired(now)
	return owners, nil
}

// describe asks EC2 for the tags of ids. It filters on instance-id rather than passing
// InstanceIds, which fails the whole call when one instance is already gone.
func (c *OwnerCache) describe(ctx context.Context, ids []string) (map[string]string, error) {
	found := map[string]string{}
	for chunk := range slices.Chunk(ids, describeChunk) {
		pages := ec2.NewDescribeInstancesPaginator(c.ec2, &ec2.DescribeInstancesInput{
			Filters: []ec2types.Filter{{Name: aws.String("instance-id"), Values: chunk}},
		})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				return nil, fmt.Errorf("describing instances %s: %w", strings.Join(chunk, ","), err)
			}
			for _, r := range page.Reservations {
				for _, inst := range r.Instances {
					found[aws.ToString(inst.InstanceId)] = clusterOf(inst.Tags)
				}
			}
		}
	}
	return found, nil
}

// evictExpired drops expired entries; the caller holds c.mu.
func (c *OwnerCache) evictExpired(now time.Time) {
	for id, e := range c.entries {
		if !now.Before(e.expires) {
			delete(c.entries, id)
		}
	}
}

// clusterOf returns the cluster an instance's tags name, or "".
func clusterOf(tags []ec2types.Tag) string {
	byKey := make(map[string]string, len(tags))
	var prefixed []string
	for _, t := range tags {
		k, v := aws.ToString(t.Key), aws.ToString(t.Value)
		byKey[k] = v
		if name, ok := strings.CutPrefix(k, tagClusterPrefix); ok && name != "" && (v == "owned" || v == "shared") {
			prefixed = append(prefixed, name)
		}
	}
	for _, k := range []string{tagKarpenterCluster, tagNodeGroupCluster} {
		if v := byKey[k]; v != "" {
			return v
		}
	}
	// Several kubernetes.io/cluster/ tags make the owner ambiguous: route nowhere rather than
	// guess, and the event is counted as dropped.
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	return ""
}

// Package realistic builds the Nodes and NodeClaims that Karpenter and the kubelet keep for
// an EC2 node, with everything a real cluster stores (images, conditions, Karpenter's labels
// and annotations), for the benches that weigh and load the router: the live bench creates
// them on an API server, the cache weighing (CacheHeap) decodes them as a watch does.
package realistic

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// Objects that look like the ones Karpenter and the kubelet keep for an EC2 node: a Node with
// its ~40 cached images, conditions, addresses and Karpenter's labels; a NodeClaim with its
// requirements, resources and status conditions. The router's memory is measured against
// these, so they carry what a real cluster stores, not what the router reads.

// InstanceID is the instance ID of node i of a set (offset keeps sets apart).
func InstanceID(i int) string { return fmt.Sprintf("i-0%016x", 0xbe00000000000+i) }

// NodeName is the name of node i.
func NodeName(i int) string {
	return fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", 16+i/65536, (i/256)%256, i%256)
}

func hexOf(s string, n int) string {
	h := sha256.Sum256([]byte(s))
	out := hex.EncodeToString(h[:])
	for len(out) < n {
		out += out
	}
	return out[:n]
}

var zones = []string{"eu-west-1a", "eu-west-1b", "eu-west-1c"}

type shape struct {
	typ, family, size, cpu, memMiB string
	gen                            string
}

var shapes = []shape{
	{"m7i.2xlarge", "m7i", "2xlarge", "8", "32768", "7"},
	{"r7i.4xlarge", "r7i", "4xlarge", "16", "131072", "7"},
	{"c7i.4xlarge", "c7i", "4xlarge", "16", "32768", "7"},
	{"m6i.xlarge", "m6i", "xlarge", "4", "16384", "6"},
}

// labels are what Karpenter puts on a NodeClaim and its Node, plus a team's own label.
func labels(i int, pool string) map[string]string {
	s := shapes[i%len(shapes)]
	zone := zones[i%len(zones)]
	return map[string]string{
		karpv1.NodePoolLabelKey:                                      pool,
		karpv1.CapacityTypeLabelKey:                                  []string{"on-demand", "spot"}[i%2],
		"karpenter.k8s.aws/ec2nodeclass":                             "default",
		"karpenter.k8s.aws/instance-category":                        s.family[:1],
		"karpenter.k8s.aws/instance-family":                          s.family,
		"karpenter.k8s.aws/instance-generation":                      s.gen,
		"karpenter.k8s.aws/instance-size":                            s.size,
		"karpenter.k8s.aws/instance-cpu":                             s.cpu,
		"karpenter.k8s.aws/instance-cpu-manufacturer":                "intel",
		"karpenter.k8s.aws/instance-memory":                          s.memMiB,
		"karpenter.k8s.aws/instance-hypervisor":                      "nitro",
		"karpenter.k8s.aws/instance-encryption-in-transit-supported": "true",
		"karpenter.k8s.aws/instance-ebs-bandwidth":                   "10000",
		"karpenter.k8s.aws/instance-network-bandwidth":               "3750",
		corev1.LabelArchStable:                                       "amd64",
		corev1.LabelOSStable:                                         "linux",
		corev1.LabelInstanceTypeStable:                               s.typ,
		corev1.LabelTopologyRegion:                                   "eu-west-1",
		corev1.LabelTopologyZone:                                     zone,
		"topology.k8s.aws/zone-id":                                   "euw1-az" + fmt.Sprint(1+i%3),
		"team.example.com/owner":                                     []string{"payments", "search", "ingest"}[i%3],
	}
}

var imageRepos = []string{
	"602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/kube-proxy", "602401143452.dkr.ecr.eu-west-1.amazonaws.com/amazon-k8s-cni",
	"602401143452.dkr.ecr.eu-west-1.amazonaws.com/amazon-k8s-cni-init", "602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/coredns",
	"602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/aws-ebs-csi-driver", "602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/csi-node-driver-registrar",
	"602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/livenessprobe", "602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/pause",
	"public.ecr.aws/aws-observability/aws-for-fluent-bit", "public.ecr.aws/datadog/agent", "quay.io/prometheus/node-exporter",
	"registry.k8s.io/kube-state-metrics/kube-state-metrics", "docker.io/istio/proxyv2", "ghcr.io/example/payments-api",
	"111122223333.dkr.ecr.eu-west-1.amazonaws.com/search/indexer", "111122223333.dkr.ecr.eu-west-1.amazonaws.com/ingest/worker",
	"docker.io/library/nginx", "docker.io/library/redis", "quay.io/jetstack/cert-manager-controller", "registry.k8s.io/ingress-nginx/controller",
}

// images are ~40 cached images, as the kubelet reports them: a digest name and a tag name
// each, and a size.
func images(i int) []corev1.ContainerImage {
	out := make([]corev1.ContainerImage, 0, 40)
	for k := 0; k < 40; k++ {
		repo := imageRepos[k%len(imageRepos)]
		tag := fmt.Sprintf("v1.%d.%d-eksbuild.%d", 28+k%7, (i+k)%5, 1+k%3)
		out = append(out, corev1.ContainerImage{
			Names:     []string{repo + "@sha256:" + hexOf(fmt.Sprint(repo, k, i%7), 64), repo + ":" + tag},
			SizeBytes: int64(5_000_000 + (k*7919+i)%400_000_000),
		})
	}
	return out
}

func rl(cpu, mem, pods string) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem + "Mi"),
		corev1.ResourcePods: resource.MustParse(pods), corev1.ResourceEphemeralStorage: resource.MustParse("20959212Ki"),
		"hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"),
	}
}

// Node is node i of pool, as the kubelet registers it (status included) with Karpenter's
// labels and annotations.
func Node(i int, pool string, now time.Time) *corev1.Node {
	s := shapes[i%len(shapes)]
	name := NodeName(i)
	l := labels(i, pool)
	l[corev1.LabelHostname] = name
	l["beta.kubernetes.io/arch"], l["beta.kubernetes.io/os"], l["beta.kubernetes.io/instance-type"] = "amd64", "linux", s.typ
	l["failure-domain.beta.kubernetes.io/region"], l["failure-domain.beta.kubernetes.io/zone"] = "eu-west-1", zones[i%len(zones)]
	l["k8s.io/cloud-provider-aws"] = hexOf("cluster", 32)
	l[karpv1.NodeRegisteredLabelKey], l[karpv1.NodeInitializedLabelKey] = "true", "true"
	ip := fmt.Sprintf("10.%d.%d.%d", 16+i/65536, (i/256)%256, i%256)
	t := metav1.NewTime(now.Add(-time.Duration(i%500) * time.Hour))
	cond := func(typ corev1.NodeConditionType, st corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: st, LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: t, Reason: reason, Message: msg}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Annotations: map[string]string{
			"alpha.kubernetes.io/provided-node-ip":                   ip,
			"node.alpha.kubernetes.io/ttl":                           "0",
			"volumes.kubernetes.io/controller-managed-attach-detach": "true",
			"karpenter.k8s.aws/ec2nodeclass-hash":                    fmt.Sprint(1e18 + float64(i%9)),
			"karpenter.k8s.aws/ec2nodeclass-hash-version":            "v4",
			"karpenter.sh/nodepool-hash":                             "4012513481623584108",
			"karpenter.sh/nodepool-hash-version":                     "v3",
			"csi.volume.kubernetes.io/nodeid":                        `{"ebs.csi.aws.com":"` + InstanceID(i) + `"}`,
		}},
		Spec: corev1.NodeSpec{ProviderID: fmt.Sprintf("aws:///%s/%s", zones[i%len(zones)], InstanceID(i))},
		Status: corev1.NodeStatus{
			Capacity: rl(s.cpu, s.memMiB, "58"), Allocatable: rl(s.cpu, s.memMiB, "58"),
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
			},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeInternalDNS, Address: name}, {Type: corev1.NodeHostName, Address: name}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{
				MachineID: hexOf(name, 32), SystemUUID: "ec2" + hexOf(name+"u", 29), BootID: hexOf(name+"b", 36),
				KernelVersion: "6.12.40-63.114.amzn2023.x86_64", OSImage: "Amazon Linux 2023.9.20261118", ContainerRuntimeVersion: "containerd://2.1.4",
				KubeletVersion: "v1.34.1-eks-113cf36", KubeProxyVersion: "", OperatingSystem: "linux", Architecture: "amd64",
			},
			Images: images(i),
		},
	}
}

// NodeClaim is the NodeClaim of node i (its image ami): created by Karpenter with its requirements, then
// launched, registered and initialized (its status written through the status subresource).
func NodeClaim(i int, pool string, poolUID types.UID, ami string, now time.Time) *karpv1.NodeClaim {
	s := shapes[i%len(shapes)]
	t := metav1.NewTime(now.Add(-time.Duration(i%500) * time.Hour))
	cond := func(typ, reason string) status.Condition {
		return status.Condition{Type: typ, Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: t, Reason: reason}
	}
	req := func(key string, values ...string) karpv1.NodeSelectorRequirementWithMinValues {
		return karpv1.NodeSelectorRequirementWithMinValues{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
	}
	ctrl := true
	return &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: ClaimName(pool, i), Labels: labels(i, pool), Finalizers: []string{karpv1.TerminationFinalizer},
			Annotations: map[string]string{
				"karpenter.k8s.aws/ec2nodeclass-hash": fmt.Sprint(1e18 + float64(i%9)), "karpenter.k8s.aws/ec2nodeclass-hash-version": "v4",
				"karpenter.sh/nodepool-hash": "4012513481623584108", "karpenter.sh/nodepool-hash-version": "v3", "karpenter.k8s.aws/tagged": "true",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "karpenter.sh/v1", Kind: "NodePool", Name: pool, UID: poolUID, BlockOwnerDeletion: &ctrl}},
		},
		Spec: karpv1.NodeClaimSpec{
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{
				req(karpv1.NodePoolLabelKey, pool), req(corev1.LabelArchStable, "amd64"), req(corev1.LabelOSStable, "linux"),
				req(karpv1.CapacityTypeLabelKey, "on-demand", "spot"), req("karpenter.k8s.aws/instance-category", "c", "m", "r"),
				req(corev1.LabelInstanceTypeStable, s.typ), req("karpenter.k8s.aws/ec2nodeclass", "default"),
			},
			Resources:    karpv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3150m"), corev1.ResourceMemory: resource.MustParse("6Gi"), corev1.ResourcePods: resource.MustParse("12")}},
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			ExpireAfter:  karpv1.MustParseNillableDuration("720h"),
		},
		Status: karpv1.NodeClaimStatus{
			NodeName: NodeName(i), ProviderID: fmt.Sprintf("aws:///%s/%s", zones[i%len(zones)], InstanceID(i)), ImageID: ami,
			Capacity: rl(s.cpu, s.memMiB, "58"), Allocatable: rl(s.cpu, s.memMiB, "58"),
			Conditions: []status.Condition{
				cond("Launched", "Launched"), cond("Registered", "Registered"), cond("Initialized", "Initialized"),
				cond("ConsistentStateFound", "ConsistentStateFound"), cond("Ready", "Ready"),
				{Type: "Consolidatable", Status: metav1.ConditionFalse, ObservedGeneration: 1, LastTransitionTime: t, Reason: "NotConsolidatable", Message: "pods scheduled recently"},
			},
		},
	}
}

// ClaimName is the name of the NodeClaim of node i of pool.
func ClaimName(pool string, i int) string { return fmt.Sprintf("%s-%06d", pool, i) }

// AMI is the image of NodeClaims whose image no EC2 stand-in registered.
const AMI = "ami-0c55b159cbfafe1f0"

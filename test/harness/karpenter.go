package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/eks"
	ekstypes "github.com/aws/aws-sdk-go-v2/service/eks/types"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
)

// KarpenterCluster is the name of the cluster the real Karpenter serves: its discovery tag
// (karpenter.sh/discovery) on the subnet and security group, and the EKS cluster in moto.
const KarpenterCluster = "health-router-test"

// KarpenterInstanceType is the one instance type the stage's NodePools allow, so that every
// launch is alike (moto offers every type in every zone).
const KarpenterInstanceType = "m5.large"

// KarpenterStage is the real Karpenter AWS controller (a process, built by
// test/tools/karpenter-bin.sh) on envtest's kube-apiserver and moto_server, with its
// interruption queue, as a cluster would run it, less the kubelet: Launch plays the node.
type KarpenterStage struct {
	Env  *envtest.Environment
	Rest *rest.Config
	Kube client.Client
	Moto string
	// Endpoint is the AWS endpoint of the stage's processes (Karpenter's AWS_ENDPOINT_URL):
	// moto, or with LocalSQS a split of SQS's calls to the in-test SQS and the rest to moto.
	Endpoint string
	// LocalSQS is the in-test SQS (KarpenterStageOptions.LocalSQS), or nil.
	LocalSQS   *SQS
	AWS        aws.Config
	SQS        *sqs.Client
	EC2        *ec2.Client
	QueueName  string
	QueueURL   string
	MetricsURL string
	// Log is Karpenter's log file (JSON lines), kept when a test fails.
	Log string

	cmd   *exec.Cmd
	exit  chan error
	stops []func()
}

// StartKarpenterStage starts envtest (Karpenter's and the AWS provider's CRDs), moto_server
// and the Karpenter controller at bin, prepares moto as an EKS cluster Karpenter can launch
// into (cluster, subnet, security group, instance profile, AMI) and creates the EC2NodeClass
// "default". It returns once Karpenter serves metrics and the EC2NodeClass is Ready. dir
// holds the kubeconfig and Karpenter's log.
func StartKarpenterStage(ctx context.Context, bin, dir string) (*KarpenterStage, error) {
	return StartKarpenterStageWith(ctx, bin, dir, KarpenterStageOptions{})
}

// KarpenterStageOptions change the stage.
type KarpenterStageOptions struct {
	// LocalSQS serves SQS (Karpenter's interruption queue, and the queues tests create) from
	// the in-test SQS instead of moto, whose cost per call grows with its queues: the benches
	// that measure latency under a burst use it; everything else stays on moto.
	LocalSQS bool
	// NodeRepair turns on Karpenter's node repair (the NodeRepair feature gate): v1.15 repairs
	// as a voluntary disruption, paced by the NodePools' budgets for the reason Unhealthy.
	NodeRepair bool
	// RepairToleration, when set, is how long a repair policy tolerates its condition (a
	// NotReady Node: 30 minutes in the provider's policies) before Karpenter repairs. Only the
	// controller test/tools/karpenter-bin.sh builds with "repair" reads it
	// (HEALTH_ROUTER_REPAIR_TOLERATION); the provider's own controller would ignore it.
	RepairToleration time.Duration
	// Env, when set, is an envtest already running (the cluster in a box, test/box: the same
	// CRDs as StartEnvtest's), which the stage uses and leaves running at Stop; unset, the
	// stage starts its own.
	Env *envtest.Environment
}

// StartKarpenterStageWith is StartKarpenterStage with options.
func StartKarpenterStageWith(ctx context.Context, bin, dir string, opts KarpenterStageOptions) (_ *KarpenterStage, err error) {
	if bin == "" {
		return nil, errors.New("no Karpenter controller binary: set KARPENTER_BIN=$(test/tools/karpenter-bin.sh) (make test does)")
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("Karpenter controller binary: %w", err)
	}
	s := &KarpenterStage{QueueName: "karpenter-interruption", exit: make(chan error, 1)}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	if err := s.startKube(opts.Env); err != nil {
		return nil, err
	}
	moto, stop, err := StartMoto()
	if err != nil {
		return nil, err
	}
	s.Moto, s.Endpoint = moto, moto
	s.stops = append(s.stops, stop)
	s.AWS = AWSConfig(nil)
	sqsURL := moto
	if opts.LocalSQS {
		s.LocalSQS = NewSQS()
		split := AWSSplit(moto, s.LocalSQS.URL)
		s.stops = append(s.stops, s.LocalSQS.Close, split.Close)
		s.Endpoint, sqsURL = split.URL, s.LocalSQS.URL
	}
	s.SQS = sqs.NewFromConfig(s.AWS, func(o *sqs.Options) { o.BaseEndpoint = aws.String(sqsURL) })
	s.EC2 = ec2.NewFromConfig(s.AWS, func(o *ec2.Options) { o.BaseEndpoint = aws.String(moto) })
	image, profile, err := s.prepareAWS(ctx)
	if err != nil {
		return nil, fmt.Errorf("preparing moto for Karpenter: %w", err)
	}
	if err := s.startKarpenter(ctx, bin, dir, opts); err != nil {
		return nil, err
	}
	if err := s.nodeClass(ctx, image, profile); err != nil {
		return nil, err
	}
	return s, nil
}

// startKube starts envtest (StartEnvtest: Karpenter's, the AWS provider's and the router's
// CRDs), or uses env, started elsewhere and left running.
func (s *KarpenterStage) startKube(env *envtest.Environment) error {
	if env == nil {
		started, _, err := StartEnvtest()
		if err != nil {
			return err
		}
		env = started
		s.stops = append(s.stops, func() { _ = started.Stop() })
	}
	s.Env, s.Rest = env, env.Config
	scheme, err := cluster.NewScheme()
	if err != nil {
		return err
	}
	s.Kube, err = client.New(s.Rest, client.Options{Scheme: scheme})
	return err
}

// prepareAWS makes moto an EKS cluster Karpenter can launch into.
func (s *KarpenterStage) prepareAWS(ctx context.Context) (image, profile string, err error) {
	tag := []ec2types.Tag{{Key: aws.String("karpenter.sh/discovery"), Value: aws.String(KarpenterCluster)}}
	vpc, err := s.EC2.CreateVpc(ctx, &ec2.CreateVpcInput{CidrBlock: aws.String("10.0.0.0/16")})
	if err != nil {
		return "", "", fmt.Errorf("creating the VPC: %w", err)
	}
	vpcID := aws.ToString(vpc.Vpc.VpcId)
	subnet, err := s.EC2.CreateSubnet(ctx, &ec2.CreateSubnetInput{VpcId: aws.String(vpcID), CidrBlock: aws.String("10.0.0.0/18"), AvailabilityZone: aws.String(Region + "a"),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeSubnet, Tags: tag}}})
	if err != nil {
		return "", "", fmt.Errorf("creating the subnet: %w", err)
	}
	sg, err := s.EC2.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{GroupName: aws.String("nodes"), Description: aws.String("nodes"), VpcId: aws.String(vpcID),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeSecurityGroup, Tags: tag}}})
	if err != nil {
		return "", "", fmt.Errorf("creating the security group: %w", err)
	}
	// moto's RegisterImage drops the architecture, and Karpenter skips an image without one;
	// moto's own Amazon Linux 2 images have it.
	images, err := s.EC2.DescribeImages(ctx, &ec2.DescribeImagesInput{Owners: []string{"amazon"}, Filters: []ec2types.Filter{
		{Name: aws.String("name"), Values: []string{"amzn2-ami-hvm-*"}},
		{Name: aws.String("architecture"), Values: []string{"x86_64"}},
		{Name: aws.String("state"), Values: []string{"available"}},
	}})
	if err != nil {
		return "", "", fmt.Errorf("finding an x86_64 Amazon Linux image: %w", err)
	}
	if len(images.Images) == 0 {
		return "", "", errors.New("moto has no x86_64 Amazon Linux 2 image")
	}
	image = aws.ToString(images.Images[0].ImageId)
	iamc := iam.NewFromConfig(s.AWS, func(o *iam.Options) { o.BaseEndpoint = aws.String(s.Moto) })
	role, err := iamc.CreateRole(ctx, &iam.CreateRoleInput{RoleName: aws.String("KarpenterNodeRole"), AssumeRolePolicyDocument: aws.String(`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}`)})
	if err != nil {
		return "", "", fmt.Errorf("creating the node role: %w", err)
	}
	if _, err := iamc.CreateInstanceProfile(ctx, &iam.CreateInstanceProfileInput{InstanceProfileName: aws.String("KarpenterNodeInstanceProfile")}); err != nil {
		return "", "", fmt.Errorf("creating the instance profile: %w", err)
	}
	if _, err := iamc.AddRoleToInstanceProfile(ctx, &iam.AddRoleToInstanceProfileInput{InstanceProfileName: aws.String("KarpenterNodeInstanceProfile"), RoleName: role.Role.RoleName}); err != nil {
		return "", "", fmt.Errorf("adding the node role to the instance profile: %w", err)
	}
	// The AL2023 family asks DescribeCluster for the service CIDR.
	eksc := eks.NewFromConfig(s.AWS, func(o *eks.Options) { o.BaseEndpoint = aws.String(s.Moto) })
	if _, err := eksc.CreateCluster(ctx, &eks.CreateClusterInput{Name: aws.String(KarpenterCluster), RoleArn: role.Role.Arn,
		ResourcesVpcConfig:      &ekstypes.VpcConfigRequest{SubnetIds: []string{aws.ToString(subnet.Subnet.SubnetId)}, SecurityGroupIds: []string{aws.ToString(sg.GroupId)}},
		KubernetesNetworkConfig: &ekstypes.KubernetesNetworkConfigRequest{ServiceIpv4Cidr: aws.String("10.100.0.0/16")}}); err != nil {
		return "", "", fmt.Errorf("creating the EKS cluster: %w", err)
	}
	queue, err := s.SQS.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(s.QueueName), Attributes: map[string]string{"MessageRetentionPeriod": "300"}})
	if err != nil {
		return "", "", fmt.Errorf("creating Karpenter's queue: %w", err)
	}
	s.QueueURL = aws.ToString(queue.QueueUrl)
	return image, "KarpenterNodeInstanceProfile", nil
}

func (s *KarpenterStage) startKarpenter(ctx context.Context, bin, dir string, opts KarpenterStageOptions) error {
	user, err := s.Env.AddUser(envtest.User{Name: "karpenter", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding Karpenter's user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	kcPath := filepath.Join(dir, "karpenter.kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return err
	}
	metrics, probe := freePort(), freePort()
	s.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)
	s.Log = filepath.Join(dir, "karpenter.log")
	logf, err := os.Create(s.Log)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+kcPath,
		"AWS_ENDPOINT_URL="+s.Endpoint,
		"AWS_ACCESS_KEY_ID=testing", "AWS_SECRET_ACCESS_KEY=testing", "AWS_SESSION_TOKEN=", "AWS_REGION="+Region, "AWS_EC2_METADATA_DISABLED=true",
		"CLUSTER_NAME="+KarpenterCluster,
		"CLUSTER_ENDPOINT="+s.Rest.Host,
		"INTERRUPTION_QUEUE="+s.QueueName,
		"ISOLATED_VPC=true",
		// moto answers dry runs unevenly; the EC2NodeClass's dry-run validation is not what
		// these suites are about.
		"DISABLE_DRY_RUN=true",
		"DISABLE_LEADER_ELECTION=true",
		"SYSTEM_NAMESPACE=kube-system",
		fmt.Sprintf("METRICS_PORT=%d", metrics),
		fmt.Sprintf("HEALTH_PROBE_PORT=%d", probe),
		"LOG_LEVEL=debug",
	)
	if opts.NodeRepair {
		cmd.Env = append(cmd.Env, "FEATURE_GATES=NodeRepair=true")
	}
	if opts.RepairToleration > 0 {
		cmd.Env = append(cmd.Env, "HEALTH_ROUTER_REPAIR_TOLERATION="+opts.RepairToleration.String())
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting Karpenter's controller %s: %w", bin, err)
	}
	s.cmd = cmd
	go func() { s.exit <- cmd.Wait(); logf.Close() }()
	s.stops = append(s.stops, func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-s.exit:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-s.exit
		}
	})
	return s.waitFor(ctx, "Karpenter serving metrics", 2*time.Minute, func() (bool, error) {
		resp, err := http.Get(s.MetricsURL)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (s *KarpenterStage) nodeClass(ctx context.Context, image, profile string) error {
	selector := map[string]string{"karpenter.sh/discovery": KarpenterCluster}
	nc := &awsv1.EC2NodeClass{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: awsv1.EC2NodeClassSpec{
		AMIFamily:                  aws.String(awsv1.AMIFamilyAL2023),
		AMISelectorTerms:           []awsv1.AMISelectorTerm{{ID: image}},
		InstanceProfile:            aws.String(profile),
		SubnetSelectorTerms:        []awsv1.SubnetSelectorTerm{{Tags: selector}},
		SecurityGroupSelectorTerms: []awsv1.SecurityGroupSelectorTerm{{Tags: selector}},
	}}
	if err := s.Kube.Create(ctx, nc); err != nil {
		return fmt.Errorf("creating the EC2NodeClass: %w", err)
	}
	err := s.waitFor(ctx, "EC2NodeClass default Ready", 2*time.Minute, func() (bool, error) {
		if err := s.Kube.Get(ctx, client.ObjectKeyFromObject(nc), nc); err != nil {
			return false, err
		}
		return nc.StatusConditions().Root().IsTrue(), nil
	})
	if err != nil {
		var conds []string
		for _, c := range nc.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message))
		}
		return fmt.Errorf("%w; conditions: %s", err, strings.Join(conds, "; "))
	}
	return nil
}

// NodePool creates a NodePool on the EC2NodeClass "default" with the router's annotations.
// Voluntary disruption is off (budget nodes "0"): moto's fleet does not apply the launch
// template's security groups, so Karpenter would see every node as drifted.
func (s *KarpenterStage) NodePool(ctx context.Context, name string, annotations map[string]string) error {
	return s.NodePoolBudgets(ctx, name, annotations, []karpv1.Budget{{Nodes: "0"}})
}

// NodePoolBudgets is NodePool with the pool's disruption budgets.
func (s *KarpenterStage) NodePoolBudgets(ctx context.Context, name string, annotations map[string]string, budgets []karpv1.Budget) error {
	np := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
				Requirements: poolRequirements(),
			}},
			Disruption: karpv1.Disruption{ConsolidateAfter: karpv1.MustParseNillableDuration("Never"), Budgets: budgets},
		},
	}
	if err := s.Kube.Create(ctx, np); err != nil {
		return fmt.Errorf("creating nodepool %s: %w", name, err)
	}
	return nil
}

func poolRequirements() []karpv1.NodeSelectorRequirementWithMinValues {
	return []karpv1.NodeSelectorRequirementWithMinValues{
		{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}},
		{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}},
		{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}},
		{Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpIn, Values: []string{KarpenterInstanceType}},
	}
}

// Node is a node Karpenter launched and the stage registered.
type Node struct {
	NodeClaim string
	Node      string
	Instance  string
}

// Launch creates n NodeClaims in pool, as Karpenter's provisioner would, waits until
// Karpenter has launched each through moto's CreateFleet, and plays the kubelet: it creates
// each Node with the NodeClaim's provider ID, labels and the karpenter.sh/unregistered taint,
// marks it Ready and removes the not-ready taint the API server adds. It returns once
// Karpenter has registered and initialized every NodeClaim.
func (s *KarpenterStage) Launch(ctx context.Context, pool string, n int) ([]Node, error) {
	np := &karpv1.NodePool{}
	if err := s.Kube.Get(ctx, client.ObjectKey{Name: pool}, np); err != nil {
		return nil, fmt.Errorf("nodepool %s: %w", pool, err)
	}
	claims := make([]*karpv1.NodeClaim, n)
	for i := range claims {
		claims[i] = &karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName:    pool + "-",
				Labels:          map[string]string{karpv1.NodePoolLabelKey: pool},
				Annotations:     map[string]string{karpv1.NodePoolHashAnnotationKey: np.Hash(), karpv1.NodePoolHashVersionAnnotationKey: karpv1.NodePoolHashVersion},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "karpenter.sh/v1", Kind: "NodePool", Name: np.Name, UID: np.UID, BlockOwnerDeletion: aws.Bool(true)}},
			},
			Spec: karpv1.NodeClaimSpec{
				NodeClassRef: np.Spec.Template.Spec.NodeClassRef,
				Requirements: append(poolRequirements(), karpv1.NodeSelectorRequirementWithMinValues{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{pool}}),
				Resources:    karpv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourcePods: mustQuantity("1")}},
			},
		}
		if err := s.Kube.Create(ctx, claims[i]); err != nil {
			return nil, fmt.Errorf("creating a nodeclaim in %s: %w", pool, err)
		}
	}
	// One List per poll for all the NodeClaims, not a Get per NodeClaim: a launch of hundreds
	// would otherwise flood the API server.
	wanted := map[string]int{}
	for i, nc := range claims {
		wanted[nc.Name] = i
	}
	list := func() ([]karpv1.NodeClaim, error) {
		var l karpv1.NodeClaimList
		if err := s.Kube.List(ctx, &l, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return nil, err
		}
		return slices.DeleteFunc(l.Items, func(nc karpv1.NodeClaim) bool { _, ok := wanted[nc.Name]; return !ok }), nil
	}
	nodes := make([]Node, n)
	errs := make([]error, n)
	started := map[string]bool{}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	err := s.waitFor(ctx, fmt.Sprintf("%d nodeclaims of %s launched", n, pool), 5*time.Minute, func() (bool, error) {
		items, err := list()
		if err != nil {
			return false, err
		}
		for _, nc := range items {
			if nc.Status.ProviderID == "" || started[nc.Name] {
				continue
			}
			started[nc.Name] = true
			i := wanted[nc.Name]
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				nodes[i], errs[i] = s.playKubelet(ctx, &nc)
			})
		}
		return len(started) == n, nil
	})
	wg.Wait()
	if err := errors.Join(append(errs, err)...); err != nil {
		return nil, err
	}
	err = s.waitFor(ctx, fmt.Sprintf("%d nodeclaims of %s initialized", n, pool), 5*time.Minute, func() (bool, error) {
		items, err := list()
		if err != nil {
			return false, err
		}
		ready := 0
		for _, nc := range items {
			if nc.StatusConditions().Get(karpv1.ConditionTypeInitialized).IsTrue() {
				ready++
			}
		}
		return ready == n, nil
	})
	return nodes, err
}

// playKubelet does what the kubelet of a launched NodeClaim's instance would: it registers
// the Node (provider ID, labels, the karpenter.sh/unregistered taint), marks it Ready, and
// removes the not-ready taint the API server adds.
func (s *KarpenterStage) playKubelet(ctx context.Context, nc *karpv1.NodeClaim) (Node, error) {
	id := nc.Status.ProviderID[strings.LastIndex(nc.Status.ProviderID, "/")+1:]
	labels := map[string]string{}
	for k, v := range nc.Labels {
		labels[k] = v
	}
	labels[corev1.LabelHostname] = "ip-" + id
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "ip-" + id, Labels: labels},
		Spec:       corev1.NodeSpec{ProviderID: nc.Status.ProviderID, Taints: []corev1.Taint{karpv1.UnregisteredNoExecuteTaint}},
	}
	if err := s.Kube.Create(ctx, node); err != nil {
		return Node{}, fmt.Errorf("creating node %s: %w", node.Name, err)
	}
	// A merge patch, not an update: Karpenter's registration may already be changing the Node.
	base := client.MergeFrom(node.DeepCopy())
	node.Status = corev1.NodeStatus{
		Capacity: nc.Status.Capacity, Allocatable: nc.Status.Allocatable,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if err := s.Kube.Status().Patch(ctx, node, base); err != nil {
		return Node{}, fmt.Errorf("marking node %s Ready: %w", node.Name, err)
	}
	// The API server taints a new Node not-ready; the node lifecycle controller, which
	// envtest does not run, removes it once the Node is Ready.
	if err := s.waitFor(ctx, "node "+node.Name+" without not-ready taint", time.Minute, func() (bool, error) {
		if err := s.Kube.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return false, err
		}
		kept := node.Spec.Taints[:0]
		for _, t := range node.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(node.Spec.Taints) {
			return true, nil
		}
		node.Spec.Taints = kept
		if err := s.Kube.Update(ctx, node); err != nil && !apierrors.IsConflict(err) {
			return false, err
		}
		return false, nil
	}); err != nil {
		return Node{}, err
	}
	return Node{NodeClaim: nc.Name, Node: node.Name, Instance: id}, nil
}

// InstanceState returns the instance's state in moto.
func (s *KarpenterStage) InstanceState(ctx context.Context, id string) (string, error) {
	out, err := s.EC2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return "", fmt.Errorf("describing instance %s: %w", id, err)
	}
	for _, r := range out.Reservations {
		for _, i := range r.Instances {
			if i.State != nil {
				return string(i.State.Name), nil
			}
		}
	}
	return "", fmt.Errorf("instance %s not found", id)
}

// Metric returns the sum of a Karpenter metric over the series whose labels include labels.
func (s *KarpenterStage) Metric(name string, labels map[string]string) (float64, error) {
	resp, err := http.Get(s.MetricsURL)
	if err != nil {
		return 0, fmt.Errorf("reading Karpenter's metrics: %w", err)
	}
	defer resp.Body.Close()
	return sumMetric(resp.Body, name, labels)
}

// sumMetric sums the samples of name in the Prometheus text format whose label set
// includes labels.
func sumMetric(r io.Reader, name string, labels map[string]string) (float64, error) {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		series, value, ok := strings.Cut(line[len(name):], " ")
		if !ok {
			continue
		}
		matched := true
		for k, v := range labels {
			if !strings.Contains(series, k+`="`+v+`"`) {
				matched = false
			}
		}
		if !matched {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", line, err)
		}
		sum += f
	}
	return sum, sc.Err()
}

// Exited reports Karpenter's exit, if it has exited.
func (s *KarpenterStage) Exited() error {
	select {
	case err := <-s.exit:
		s.exit <- err
		return fmt.Errorf("Karpenter's controller exited: %v (log: %s)", err, s.Log)
	default:
		return nil
	}
}

// Stop stops Karpenter, moto and envtest.
func (s *KarpenterStage) Stop() {
	for i := len(s.stops) - 1; i >= 0; i-- {
		s.stops[i]()
	}
	s.stops = nil
}

func (s *KarpenterStage) waitFor(ctx context.Context, what string, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		if s.cmd != nil {
			if err := s.Exited(); err != nil {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
		}
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

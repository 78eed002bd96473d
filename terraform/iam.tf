################################################################################
# Router IAM role (IRSA or EKS Pod Identity)
################################################################################

locals {
  iam_role_name = coalesce(var.iam_role_name, "${local.name}-router")

  # terraform-aws-modules style: the issuer is the provider ARN without its "...:oidc-provider/" prefix.
  oidc_issuer = replace(coalesce(var.oidc_provider_arn, "unset"), "/^(.*provider/)/", "")

  # Both are built, one is used: the IRSA one with "unset" when identity_type is pod_identity.
  # Either is bound to this cluster's ServiceAccount. IRSA: the cluster's OIDC provider and the
  # token's sub and aud. Pod Identity: the session tags EKS sets when it assumes the role for a
  # pod (the condition applies to the AssumeRole and the TagSession alike), so that no other
  # association of the account (another cluster, namespace or ServiceAccount) gets the role.
  # An association with disable_session_tags = true cannot assume it.
  trust_statements = {
    pod_identity = [{
      Sid       = "EKSPodIdentity"
      Effect    = "Allow"
      Principal = { Service = "pods.eks.amazonaws.com" }
      Action    = ["sts:AssumeRole", "sts:TagSession"]
      Condition = {
        StringEquals = {
          "aws:RequestTag/eks-cluster-arn"            = "arn:${local.partition}:eks:${local.region}:${local.account_id}:cluster/${var.cluster_name}"
          "aws:RequestTag/kubernetes-namespace"       = var.service_account_namespace
          "aws:RequestTag/kubernetes-service-account" = var.service_account_name
        }
      }
    }]
    irsa = [{
      Sid       = "IRSA"
      Effect    = "Allow"
      Principal = { Federated = var.oidc_provider_arn }
      Action    = "sts:AssumeRoleWithWebIdentity"
      Condition = {
        StringEquals = {
          "${local.oidc_issuer}:sub" = "system:serviceaccount:${var.service_account_namespace}:${var.service_account_name}"
          "${local.oidc_issuer}:aud" = "sts.amazonaws.com"
        }
      }
    }]
  }

  # Least privilege for what the router calls (router/ and cmd/): receive, keep invisible while
  # working and back off a retry (ChangeMessageVisibility), delete on the intake queue; send dead
  # letters, and nothing else, to the DLQ (a role that could receive or delete there could erase
  # the evidence of a bad message); forward to Karpenter. GetQueueAttributes on each queue is
  # for doctor. Deferrals are held on NodeClaims: nothing is re-sent to the intake. What supports
  # no resource-level scoping is held to the module's region (aws:RequestedRegion), as Karpenter
  # holds its reads.
  in_region = { StringEquals = { "aws:RequestedRegion" = local.region } }

  # The router's EC2 writes reach this cluster's Karpenter instances in this region and account,
  # and no other instance, as Karpenter's own AllowScopedDeletion: the cluster tag Karpenter sets
  # to owned, and a NodePool tag.
  # The EC2 event windows of this region and account (the router's windows carry the cluster's tag).
  event_windows = "arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance-event-window/*"

  karpenter_instances = {
    Resource = "arn:${local.partition}:ec2:${local.region}:${local.account_id}:instance/*"
    Condition = {
      StringEquals = { "aws:ResourceTag/kubernetes.io/cluster/${var.cluster_name}" = "owned" }
      StringLike   = { "aws:ResourceTag/karpenter.sh/nodepool" = "*" }
    }
  }

  # NodePools annotated healthrouter.io/event-window=true (the router's --event-windows): one
  # EC2 event window per pool. The window calls support the instance-event-window resource and
  # its tags (Service Authorization Reference, Amazon EC2): the router may create a window only
  # with the two tags it writes, this cluster and a pool (aws:RequestTag, and no other key:
  # aws:TagKeys), set in the same call (CreateTags on the window only as part of
  # CreateInstanceEventWindow), and change, associate, disassociate or delete only windows that
  # carry both (aws:ResourceTag): every window the role can make or touch is one the router's
  # manager reads back as a pool's and keeps in line with it. DescribeInstanceEventWindows
  # supports no resource-level scoping: held to the region.
  # What a window is associated with cannot be scoped: AssociateInstanceEventWindow is authorized
  # on the window alone, with no condition key for its target (instance IDs, Dedicated Host IDs or
  # instance tags). The router associates one instance tag, which it puts on this cluster's
  # Karpenter instances alone (aws:TagKeys), with a value of this cluster's (aws:RequestTag); the
  # manager takes any other target off the cluster's windows when it next reads them
  # (router/eventwindow: strays).
  event_window_tags = {
    StringEquals                = { "aws:RequestTag/healthrouter.io/cluster" = var.cluster_name }
    StringLike                  = { "aws:RequestTag/healthrouter.io/nodepool" = "?*" }
    "ForAllValues:StringEquals" = { "aws:TagKeys" = ["healthrouter.io/cluster", "healthrouter.io/nodepool"] }
  }

  event_window_statements = [
    {
      Sid       = "EventWindowsCreate"
      Effect    = "Allow"
      Action    = "ec2:CreateInstanceEventWindow"
      Resource  = local.event_windows
      Condition = local.event_window_tags
    },
    {
      Sid      = "EventWindowsTagOnCreate"
      Effect   = "Allow"
      Action   = "ec2:CreateTags"
      Resource = local.event_windows
      Condition = merge(local.event_window_tags, {
        StringEquals = merge(local.event_window_tags.StringEquals, { "ec2:CreateAction" = "CreateInstanceEventWindow" })
      })
    },
    {
      Sid    = "EventWindowsManage"
      Effect = "Allow"
      Action = [
        "ec2:ModifyInstanceEventWindow",
        "ec2:AssociateInstanceEventWindow",
        "ec2:DisassociateInstanceEventWindow",
        "ec2:DeleteInstanceEventWindow",
      ]
      Resource = local.event_windows
      Condition = {
        StringEquals = { "aws:ResourceTag/healthrouter.io/cluster" = var.cluster_name }
        StringLike   = { "aws:ResourceTag/healthrouter.io/nodepool" = "?*" }
      }
    },
    {
      Sid       = "EventWindowsDescribe"
      Effect    = "Allow"
      Action    = "ec2:DescribeInstanceEventWindows"
      Resource  = "*"
      Condition = local.in_region
    },
    {
      Sid      = "EventWindowsTagInstances"
      Effect   = "Allow"
      Action   = "ec2:CreateTags"
      Resource = local.karpenter_instances.Resource
      Condition = merge(local.karpenter_instances.Condition, {
        StringLike                  = merge(local.karpenter_instances.Condition.StringLike, { "aws:RequestTag/healthrouter.io/event-window" = "${var.cluster_name}/*" })
        "ForAllValues:StringEquals" = { "aws:TagKeys" = ["healthrouter.io/event-window"] }
      })
    },
  ]

  router_statements = concat(
    [
      {
        Sid    = "IntakeQueue"
        Effect = "Allow"
        Action = [
          "sqs:ReceiveMessage",
          "sqs:DeleteMessage", # also authorizes DeleteMessageBatch: the router deletes in batches
          "sqs:ChangeMessageVisibility",
          "sqs:GetQueueAttributes",
        ]
        Resource = aws_sqs_queue.intake.arn
      },
      {
        Sid      = "DeadLetter"
        Effect   = "Allow"
        Action   = ["sqs:SendMessage", "sqs:GetQueueAttributes"]
        Resource = aws_sqs_queue.dlq.arn
      },
      {
        # The AMI and capacity-reservation checks before a drain; no resource-level scoping.
        Sid       = "PreDrainChecks"
        Effect    = "Allow"
        Action    = ["ec2:DescribeImages", "ec2:DescribeCapacityReservations"]
        Resource  = "*"
        Condition = local.in_region
      },
      {
        # The router's instance-status poller takes over from Karpenter's (which the
        # karpenter_deny_instance_status policy below switches off). The same read confirms an
        # urgent shutting-down/terminated state change before a drain (the instance's state),
        # and a reboot in place's maintenance before RebootInstances (its scheduled events):
        # read-only; DescribeInstanceStatus supports no resource-level scoping.
        Sid       = "InstanceStatusPoller"
        Effect    = "Allow"
        Action    = "ec2:DescribeInstanceStatus"
        Resource  = "*"
        Condition = local.in_region
      },
      {
        Sid      = "Metrics"
        Effect   = "Allow"
        Action   = "cloudwatch:PutMetricData"
        Resource = "*"
        Condition = { StringEquals = {
          "cloudwatch:namespace" = "HealthRouter"
          "aws:RequestedRegion"  = local.region
        } }
      },
      {
        # Read-only, for `health-router doctor`: which rules feed our queue and Karpenter's.
        Sid       = "InspectRules"
        Effect    = "Allow"
        Action    = ["events:ListRuleNamesByTarget", "events:DescribeRule"]
        Resource  = "*"
        Condition = local.in_region
      },
    ],
    # Forward mode (SendMessage also authorizes SendMessageBatch); doctor reads the queue too.
    var.karpenter_queue_arn == null ? [] : [{
      Sid      = "ForwardToKarpenter"
      Effect   = "Allow"
      Action   = ["sqs:SendMessage", "sqs:GetQueueAttributes"]
      Resource = var.karpenter_queue_arn
    }],
    # `health-router doctor` in the router's pod (the chart's settings.karpenterRoleARN): whether
    # Karpenter's role may still call ec2:DescribeInstanceStatus, the last check of the takeover
    # ("takeover from Karpenter: complete"). A simulation reads the role's policies and changes
    # nothing; only that role (with or without a path).
    var.karpenter_controller_role_name == null ? [] : [{
      Sid    = "InspectKarpenterRole"
      Effect = "Allow"
      Action = "iam:SimulatePrincipalPolicy"
      Resource = [
        "arn:${local.partition}:iam::${local.account_id}:role/${var.karpenter_controller_role_name}",
        "arn:${local.partition}:iam::${local.account_id}:role/*/${var.karpenter_controller_role_name}",
      ]
    }],
    # The router uses the key only through SQS.
    var.kms_key_arn == null ? [] : [{
      Sid       = "QueueKey"
      Effect    = "Allow"
      Action    = ["kms:Decrypt", "kms:GenerateDataKey"]
      Resource  = var.kms_key_arn
      Condition = { StringEquals = { "kms:ViaService" = "sqs.${local.region}.${data.aws_partition.current.dns_suffix}" } }
    }],
    # NodePools annotated healthrouter.io/reschedule=true: the router moves a scheduled event
    # into the pool's maintenance window. One of the router's two EC2 writes, so only when
    # asked for, and only on this cluster's Karpenter instances (local.karpenter_instances).
    !var.enable_reschedule ? [] : [merge(local.karpenter_instances, {
      Sid    = "RescheduleEvents"
      Effect = "Allow"
      Action = "ec2:ModifyInstanceEventStartTime"
    })],
    # NodePools with healthrouter.io/action.scheduled-change.instance-reboot=reboot-in-place:
    # the router reboots the instance itself once its pods are evicted (the router's
    # --reboot-in-place), which completes EC2's scheduled instance-reboot (and, with reboot
    # migration, a system-reboot). Both features act
    # on NodeClaims only, so on Karpenter's instances only.
    !var.enable_reboot_in_place ? [] : [merge(local.karpenter_instances, {
      Sid    = "RebootInPlace"
      Effect = "Allow"
      Action = "ec2:RebootInstances"
    })],
    # NodePools annotated healthrouter.io/event-window=true: local.event_window_statements.
    [for s in local.event_window_statements : s if var.enable_event_windows],
    # A system-reboot is rebooted in place by the router too where the instance offers reboot
    # migration (maintenanceOptions.rebootMigration, read with DescribeInstances): the owner's
    # reboot moves it to new hardware and clears the event. Read-only; DescribeInstances
    # supports no resource-level scoping.
    !var.enable_reboot_in_place ? [] : [{
      Sid       = "RebootMigration"
      Effect    = "Allow"
      Action    = "ec2:DescribeInstances"
      Resource  = "*"
      Condition = local.in_region
    }],
  )
}

resource "aws_iam_role" "router" {
  count = var.create_iam_role ? 1 : 0

  name                 = local.iam_role_name
  description          = "health-router in EKS cluster ${var.cluster_name}"
  assume_role_policy   = jsonencode({ Version = "2012-10-17", Statement = local.trust_statements[var.identity_type] })
  permissions_boundary = var.iam_role_permissions_boundary

  tags = var.tags
}

resource "aws_iam_role_policy" "router" {
  count = var.create_iam_role ? 1 : 0

  name   = "health-router"
  role   = aws_iam_role.router[0].id
  policy = jsonencode({ Version = "2012-10-17", Statement = local.router_statements })
}

resource "aws_eks_pod_identity_association" "router" {
  count = var.create_iam_role && var.create_pod_identity_association ? 1 : 0

  cluster_name    = var.cluster_name
  namespace       = var.service_account_namespace
  service_account = var.service_account_name
  role_arn        = aws_iam_role.router[0].arn

  tags = var.tags
}

################################################################################
# Karpenter side: stop Karpenter acting on scheduled events by itself
################################################################################

# Karpenter v1.12+ polls ec2:DescribeInstanceStatus every minute and drains instances with
# scheduled events (instance-stop, instance-retirement, system/instance-reboot,
# system-maintenance) on its own, which would undo every deferral the router makes; v1.13+
# also force-terminates instances impaired for two minutes. An explicit Deny wins over any
# Allow in Karpenter's controller policy. The router's own poller (statement
# InstanceStatusPoller above) takes both over, so nothing Karpenter did is lost.
resource "aws_iam_policy" "karpenter_deny_instance_status" {
  count = var.create_karpenter_deny_policy ? 1 : 0

  name        = "${local.name}-karpenter-deny-instance-status"
  description = "Keeps Karpenter from acting on EC2 scheduled events that health-router decides on"
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid      = "HealthRouterDecidesScheduledEvents"
      Effect   = "Deny"
      Action   = "ec2:DescribeInstanceStatus"
      Resource = "*"
    }]
  })

  tags = var.tags
}

resource "aws_iam_role_policy_attachment" "karpenter_deny_instance_status" {
  count = var.create_karpenter_deny_policy && var.karpenter_controller_role_name != null && !var.shadow ? 1 : 0

  role       = var.karpenter_controller_role_name
  policy_arn = aws_iam_policy.karpenter_deny_instance_status[0].arn
}

# One EKS cluster: the intake queue, the EventBridge rules, the router's role (EKS Pod Identity),
# the dashboard and alarms, and the policy that keeps Karpenter from acting on scheduled events.

provider "aws" {
  region = var.region
}

module "health_router" {
  source = "../.."

  cluster_name = var.cluster_name

  identity_type                   = "pod_identity"
  create_pod_identity_association = true

  # Forward mode: the router sends the events it decides to act on to Karpenter's queue.
  karpenter_queue_arn = var.karpenter_queue_arn

  # Until the takeover (docs/runbook.md) the router runs in shadow beside Karpenter's own
  # handling: it decides and records, Karpenter acts. Karpenter v1.12+ drains on scheduled events
  # it finds with DescribeInstanceStatus: the deny is created now and attached to Karpenter's
  # role only at the takeover.
  shadow                         = !var.takeover
  create_karpenter_deny_policy   = true
  karpenter_controller_role_name = var.karpenter_controller_role_name

  alarm_sns_topic_arn = var.alarm_sns_topic_arn

  tags = { "app.kubernetes.io/name" = "health-router" }
}

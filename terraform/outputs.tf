output "queue_url" {
  description = "URL of the intake queue: the router's --queue-url (HEALTH_ROUTER_QUEUE_URL)."
  value       = aws_sqs_queue.intake.url
}

output "queue_arn" {
  description = "ARN of the intake queue."
  value       = aws_sqs_queue.intake.arn
}

output "queue_name" {
  description = "Name of the intake queue."
  value       = aws_sqs_queue.intake.name
}

output "dead_letter_queue_url" {
  description = "URL of the dead-letter queue, where the router sends poison messages."
  value       = aws_sqs_queue.dlq.url
}

output "dead_letter_queue_arn" {
  description = "ARN of the dead-letter queue."
  value       = aws_sqs_queue.dlq.arn
}

output "iam_role_arn" {
  description = "ARN of the router's IAM role (the eks.amazonaws.com/role-arn service account annotation for IRSA, or the Pod Identity association's role). Null when create_iam_role is false."
  value       = try(aws_iam_role.router[0].arn, null)
}

output "iam_role_name" {
  description = "Name of the router's IAM role."
  value       = try(aws_iam_role.router[0].name, null)
}

output "rule_names" {
  description = "EventBridge rule names by event kind."
  value       = { for kind, r in aws_cloudwatch_event_rule.this : kind => r.name }
}

output "rule_arns" {
  description = "EventBridge rule ARNs by event kind."
  value       = { for kind, r in aws_cloudwatch_event_rule.this : kind => r.arn }
}

output "karpenter_queue_url" {
  description = "URL of Karpenter's interruption queue (from karpenter_queue_arn): the router's --karpenter-queue-url in forward mode, and what health-router handback --karpenter-queue-url needs to drain the pending events through Karpenter. Null without karpenter_queue_arn."
  value       = local.karpenter_queue_url
}

output "router_environment" {
  description = "The router's settings as its environment variables (each flag's HEALTH_ROUTER_* fallback), for a ConfigMap or Helm values: intake and dead-letter queue URLs, Karpenter's queue URL in forward mode, region, account, and CloudWatch metrics on with this cluster_name (the dashboard and the router-silent alarm need them)."
  value = merge(
    {
      HEALTH_ROUTER_QUEUE_URL             = aws_sqs_queue.intake.url
      HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL = aws_sqs_queue.dlq.url
      HEALTH_ROUTER_REGION                = local.region
      HEALTH_ROUTER_ACCOUNT               = local.account_id
      HEALTH_ROUTER_CLOUDWATCH_METRICS    = "true"
      HEALTH_ROUTER_CLUSTER_NAME          = var.cluster_name
    },
    { for k, v in { HEALTH_ROUTER_KARPENTER_QUEUE_URL = local.karpenter_queue_url } : k => v if v != null },
    var.shadow ? { HEALTH_ROUTER_SHADOW = "true" } : {},
  )
}

output "helm_values" {
  description = "Values for the health-router Helm chart (deploy/charts/health-router), as YAML: `terraform output -raw helm_values > values.yaml`, then `helm install ... -f values.yaml` in namespace service_account_namespace. The settings of router_environment in the chart's names, the ServiceAccount's name (service_account_name, which the role trusts), and with IRSA its eks.amazonaws.com/role-arn annotation."
  value = yamlencode({
    serviceAccount = merge(
      { name = var.service_account_name },
      { for k, v in { annotations = { "eks.amazonaws.com/role-arn" = try(aws_iam_role.router[0].arn, null) } } : k => v if var.identity_type == "irsa" && var.create_iam_role },
    )
    settings = merge(
      {
        queueURL           = aws_sqs_queue.intake.url
        deadLetterQueueURL = aws_sqs_queue.dlq.url
        region             = local.region
        account            = local.account_id
        clusterName        = var.cluster_name
        cloudWatchMetrics  = true
      },
      { for k, v in { karpenterQueueURL = local.karpenter_queue_url, karpenterRoleARN = local.karpenter_role_arn } : k => v if v != null },
      var.shadow ? { shadow = true } : {},
    )
  })
}

output "karpenter_role_arn" {
  description = "ARN of Karpenter's controller role (from karpenter_controller_role_name, without a path), which doctor checks for ec2:DescribeInstanceStatus: the chart's settings.karpenterRoleARN, and doctor's --karpenter-role-arn. Null when karpenter_controller_role_name is not set."
  value       = local.karpenter_role_arn
}

output "cluster_name" {
  description = "The ClusterName dimension of the router's metrics (--cluster-name)."
  value       = var.cluster_name
}

output "karpenter_deny_policy_arn" {
  description = "ARN of the policy denying ec2:DescribeInstanceStatus, to attach to Karpenter's controller role. Null unless create_karpenter_deny_policy."
  value       = try(aws_iam_policy.karpenter_deny_instance_status[0].arn, null)
}

output "karpenter_deny_attached_role" {
  description = "Karpenter's controller role the DescribeInstanceStatus deny is attached to; null while Karpenter keeps its own handling (the deny not attached)."
  value       = try(aws_iam_role_policy_attachment.karpenter_deny_instance_status[0].role, null)
}

output "dashboard_name" {
  description = "Name of the CloudWatch dashboard."
  value       = try(aws_cloudwatch_dashboard.this[0].dashboard_name, null)
}

output "dashboard_body" {
  description = "The rendered dashboard JSON (also when create_dashboard is false)."
  value       = local.dashboard_body
}

output "alarm_names" {
  description = "CloudWatch alarm names by purpose."
  value = merge(
    { for k, a in aws_cloudwatch_metric_alarm.dead_letters : "dead_letters" => a.alarm_name },
    { for k, a in aws_cloudwatch_metric_alarm.intake_backlog : "intake_backlog" => a.alarm_name },
    { for k, a in aws_cloudwatch_metric_alarm.router_silent : "router_silent" => a.alarm_name },
    { for k, a in aws_cloudwatch_metric_alarm.dispatcher_failures : "dispatcher_failures" => a.alarm_name },
  )
}

output "dispatcher_function_arn" {
  description = "ARN of the dispatcher Lambda. Null unless dispatcher.enabled."
  value       = try(aws_lambda_function.dispatcher[0].arn, null)
}

output "dispatcher_queue_url" {
  description = "URL of the dispatcher queue: the rules send there and an event source mapping feeds it to the dispatcher Lambda. Null unless dispatcher.enabled."
  value       = try(aws_sqs_queue.dispatcher[0].url, null)
}

output "dispatcher_failure_queue_url" {
  description = "URL of the queue holding events the dispatcher failed to route. Null unless dispatcher.enabled."
  value       = try(aws_sqs_queue.dispatcher_failures[0].url, null)
}

output "dispatcher_role_arn" {
  description = "ARN of the dispatcher Lambda's role, for the extra_sender_arns of the module instances whose intake queues it feeds. Null unless dispatcher.enabled."
  value       = try(aws_iam_role.dispatcher[0].arn, null)
}

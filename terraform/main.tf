data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

locals {
  name       = coalesce(var.name, "hr-${var.cluster_name}")
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
  account_id = data.aws_caller_identity.current.account_id

  # One EventBridge pattern per event kind the router handles, keyed by the router's kind names.
  # The Health rule is narrowed to EC2 scheduled changes: an unfiltered aws.health rule also
  # delivers RDS, account notifications and so on (which crash-looped NTH in its day).
  event_patterns = {
    "scheduled-change" = {
      source        = ["aws.health"]
      "detail-type" = ["AWS Health Event"]
      detail        = { service = ["EC2"], eventTypeCategory = ["scheduledChange"] }
    }
    "spot-interruption" = {
      source        = ["aws.ec2"]
      "detail-type" = ["EC2 Spot Instance Interruption Warning"]
    }
    "rebalance-recommendation" = {
      source        = ["aws.ec2"]
      "detail-type" = ["EC2 Instance Rebalance Recommendation"]
    }
    "state-change" = {
      source        = ["aws.ec2"]
      "detail-type" = ["EC2 Instance State-change Notification"]
    }
    "capacity-reservation-interruption" = {
      source        = ["aws.ec2"]
      "detail-type" = ["EC2 Capacity Reservation Instance Interruption Warning"]
    }
    "ami-state-change" = {
      source        = ["aws.ec2"]
      "detail-type" = ["EC2 AMI State Change"]
    }
    # A Capacity Block for ML about to end (40 minutes' warning; terminations from 10 minutes
    # later): the router drains the block's nodes. Karpenter has no rule for it.
    # EventBridge's reference names its detail-type "Capacity Block Expiration Warning" (no
    # "EC2 "), some of EC2's samples "Capacity Block Reservation Expiration Warning": both match.
    "capacity-block-expiration" = {
      source        = ["aws.ec2"]
      "detail-type" = ["Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning"]
    }
  }

  rule_enabled = {
    "scheduled-change"                  = var.rules.scheduled_change
    "spot-interruption"                 = var.rules.spot_interruption
    "rebalance-recommendation"          = var.rules.rebalance_recommendation
    "state-change"                      = var.rules.state_change
    "capacity-reservation-interruption" = var.rules.capacity_reservation_interruption
    "ami-state-change"                  = var.rules.ami_state_change
    "capacity-block-expiration"         = var.rules.capacity_block_expiration
  }

  # kind => event pattern JSON, for the enabled kinds.
  rules = { for kind, pattern in local.event_patterns : kind => jsonencode(pattern) if local.rule_enabled[kind] }

  # With the dispatcher on, the rules send to the dispatcher queue, which feeds the Lambda, and
  # nothing sends to the intake queue as EventBridge; the Lambda sends with its own role.
  rules_target_queue = !var.dispatcher.enabled
  queue_source_arns  = local.rules_target_queue ? concat([for r in aws_cloudwatch_event_rule.this : r.arn], var.extra_source_rule_arns) : var.extra_source_rule_arns

  sse_sqs = var.kms_key_arn == null

  # The router takes Karpenter's queue as a URL (--karpenter-queue-url), IAM as an ARN
  # (arn:<partition>:sqs:<region>:<account>:<name>).
  karpenter_queue_arn_parts = var.karpenter_queue_arn == null ? [] : split(":", var.karpenter_queue_arn)
  karpenter_queue_url = var.karpenter_queue_arn == null ? null : format(
    "https://sqs.%s.%s/%s/%s",
    local.karpenter_queue_arn_parts[3], data.aws_partition.current.dns_suffix,
    local.karpenter_queue_arn_parts[4], local.karpenter_queue_arn_parts[5],
  )
  # Karpenter's controller role, for doctor's takeover check (--karpenter-role-arn).
  karpenter_role_arn = var.karpenter_controller_role_name == null ? null : "arn:${local.partition}:iam::${local.account_id}:role/${var.karpenter_controller_role_name}"
}

################################################################################
# Queues
################################################################################

resource "aws_sqs_queue" "dlq" {
  name = "${local.name}-dlq"

  message_retention_seconds         = 1209600
  sqs_managed_sse_enabled           = local.sse_sqs ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = local.sse_sqs ? null : var.kms_data_key_reuse_period_seconds

  tags = var.tags
}

resource "aws_sqs_queue" "intake" {
  name = local.name

  message_retention_seconds         = var.message_retention_seconds
  visibility_timeout_seconds        = var.visibility_timeout_seconds
  receive_wait_time_seconds         = var.receive_wait_time_seconds
  sqs_managed_sse_enabled           = local.sse_sqs ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = local.sse_sqs ? null : var.kms_data_key_reuse_period_seconds

  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = var.max_receive_count
  })

  tags = var.tags
}

# Who may send to a queue. As EventBridge: this module's rules (and extra_source_rule_arns), no
# other rule; in dispatcher mode the rules send to the dispatcher queue (dispatcher.tf) and only
# extra_source_rule_arns to the intake and DLQ. As an IAM principal of the account, whatever its
# identity policy says: to the intake queue the dispatcher's role (dispatcher mode) and
# extra_sender_arns; to the DLQ the router's role and extra_dead_letter_sender_arns; to the
# dispatcher queue dispatcher.sender_arns. A message in the intake queue is an order to drain a
# node, and one in the dispatcher queue becomes one under the dispatcher's role, so an admin's
# sqs:* is not enough to send one. Nobody may use a queue without TLS.
locals {
  # IAM principals (their aws:PrincipalArn, the role's ARN for a role session) that may send.
  queue_senders = {
    intake     = concat(aws_iam_role.dispatcher[*].arn, var.extra_sender_arns)
    dlq        = concat(aws_iam_role.router[*].arn, var.extra_dead_letter_sender_arns)
    dispatcher = var.dispatcher.sender_arns
  }

  # Queue => its ARN and the EventBridge rules that may send to it.
  queue_policy_queues = merge(
    {
      intake = { arn = aws_sqs_queue.intake.arn, rules = local.queue_source_arns }
      dlq    = { arn = aws_sqs_queue.dlq.arn, rules = local.queue_source_arns }
    },
    { for q in aws_sqs_queue.dispatcher : "dispatcher" => { arn = q.arn, rules = [for r in aws_cloudwatch_event_rule.this : r.arn] } },
  )

  queue_policy_statements = {
    for key, q in local.queue_policy_queues : key => concat(
      length(q.rules) == 0 ? [] : [
        {
          Sid       = "AllowHealthRouterRules"
          Effect    = "Allow"
          Principal = { Service = "events.amazonaws.com" }
          Action    = "sqs:SendMessage"
          Resource  = q.arn
          Condition = { ArnEquals = { "aws:SourceArn" = q.rules } }
        },
        {
          Sid       = "DenyOtherRules"
          Effect    = "Deny"
          Principal = { Service = "events.amazonaws.com" }
          Action    = "sqs:SendMessage"
          Resource  = q.arn
          Condition = { ArnNotEquals = { "aws:SourceArn" = q.rules } }
        },
      ],
      length(q.rules) != 0 ? [] : [
        {
          Sid       = "DenyAllRules"
          Effect    = "Deny"
          Principal = { Service = "events.amazonaws.com" }
          Action    = "sqs:SendMessage"
          Resource  = q.arn
        },
      ],
      [
        {
          # Denied: every caller that is neither EventBridge (aws:PrincipalServiceName, set only
          # when a service principal calls; the statements above decide which rules) nor a listed
          # principal. The keys of a condition are ANDed, and a negated operator matches when its
          # key is absent: an IAM role has no aws:PrincipalServiceName, EventBridge no listed ARN.
          # With nobody listed, the ARN key is left out (IAM refuses an empty list): every
          # principal but EventBridge is denied.
          Sid       = "DenyOtherSenders"
          Effect    = "Deny"
          Principal = "*"
          Action    = "sqs:SendMessage"
          Resource  = q.arn
          Condition = merge(
            { StringNotEquals = { "aws:PrincipalServiceName" = "events.amazonaws.com" } },
            length(local.queue_senders[key]) == 0 ? {} : { ArnNotEquals = { "aws:PrincipalArn" = local.queue_senders[key] } },
          )
        },
        {
          Sid       = "DenyInsecureTransport"
          Effect    = "Deny"
          Principal = "*"
          Action    = "sqs:*"
          Resource  = q.arn
          Condition = { Bool = { "aws:SecureTransport" = "false" } }
        },
      ],
    )
  }
}

resource "aws_sqs_queue_policy" "intake" {
  queue_url = aws_sqs_queue.intake.id
  policy    = jsonencode({ Version = "2012-10-17", Statement = local.queue_policy_statements.intake })
}

resource "aws_sqs_queue_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id
  policy    = jsonencode({ Version = "2012-10-17", Statement = local.queue_policy_statements.dlq })
}

################################################################################
# EventBridge rules
################################################################################

resource "aws_cloudwatch_event_rule" "this" {
  for_each = local.rules

  name           = "${local.name}-${each.key}"
  description    = "health-router ${var.cluster_name}: ${each.key} events"
  event_bus_name = var.event_bus_name
  event_pattern  = each.value

  tags = var.tags
}

resource "aws_cloudwatch_event_target" "queue" {
  for_each = toset(local.rules_target_queue ? keys(local.rules) : [])

  rule           = aws_cloudwatch_event_rule.this[each.key].name
  event_bus_name = var.event_bus_name
  target_id      = "health-router-intake"
  arn            = aws_sqs_queue.intake.arn

  retry_policy {
    maximum_event_age_in_seconds = 86400
    maximum_retry_attempts       = 185
  }

  # Events EventBridge cannot deliver (a key policy that forgot events.amazonaws.com, a deleted
  # queue) land in the DLQ, where the dead-letters alarm sees them.
  dead_letter_config {
    arn = aws_sqs_queue.dlq.arn
  }
}

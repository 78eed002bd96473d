################################################################################
# Dispatcher Lambda: one regional rule set -> the Lambda -> each cluster's intake queue
################################################################################

locals {
  dispatcher_name = "${local.name}-dispatcher"

  # Cluster name => intake queue; this module's own queue is always one of them.
  dispatcher_queues = merge(
    { for cluster, q in var.dispatcher.cluster_queues : cluster => q },
    { (var.cluster_name) = { url = aws_sqs_queue.intake.url, arn = aws_sqs_queue.intake.arn } },
  )

  dispatcher_kms_key_arns = compact(concat(var.dispatcher.kms_key_arns, [var.kms_key_arn]))
  # kms:ViaService of the queues the dispatcher sends to: SQS in each of their regions.
  dispatcher_kms_via = distinct(concat(["sqs.${local.region}.${data.aws_partition.current.dns_suffix}"],
  [for q in values(local.dispatcher_queues) : "sqs.${split(":", q.arn)[3]}.${data.aws_partition.current.dns_suffix}"]))
}

resource "aws_sqs_queue" "dispatcher_failures" {
  count = var.dispatcher.enabled ? 1 : 0

  name = "${local.name}-dispatcher-failures"

  message_retention_seconds         = 1209600
  sqs_managed_sse_enabled           = local.sse_sqs ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = local.sse_sqs ? null : var.kms_data_key_reuse_period_seconds

  tags = var.tags
}

# EventBridge sends here when it cannot invoke the Lambda at all; the Lambda's own failures
# arrive through its on-failure destination (the Lambda role sends those).
resource "aws_sqs_queue_policy" "dispatcher_failures" {
  count = var.dispatcher.enabled && length(local.rules) > 0 ? 1 : 0

  queue_url = aws_sqs_queue.dispatcher_failures[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "AllowHealthRouterRules"
        Effect    = "Allow"
        Principal = { Service = "events.amazonaws.com" }
        Action    = "sqs:SendMessage"
        Resource  = aws_sqs_queue.dispatcher_failures[0].arn
        Condition = { ArnEquals = { "aws:SourceArn" = [for r in aws_cloudwatch_event_rule.this : r.arn] } }
      },
      {
        Sid       = "DenyInsecureTransport"
        Effect    = "Deny"
        Principal = "*"
        Action    = "sqs:*"
        Resource  = aws_sqs_queue.dispatcher_failures[0].arn
        Condition = { Bool = { "aws:SecureTransport" = "false" } }
      },
    ]
  })
}

resource "aws_iam_role" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  name                 = local.dispatcher_name
  description          = "health-router dispatcher Lambda"
  permissions_boundary = var.iam_role_permissions_boundary
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "lambda.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })

  tags = var.tags
}

resource "aws_iam_role_policy" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  name = "dispatcher"
  role = aws_iam_role.dispatcher[0].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat(
      [
        {
          Sid      = "ClusterQueues"
          Effect   = "Allow"
          Action   = "sqs:SendMessage"
          Resource = concat([for q in values(local.dispatcher_queues) : q.arn], [aws_sqs_queue.dispatcher_failures[0].arn])
        },
        {
          # No resource-level scoping for DescribeInstances: held to the module's region, where
          # the events the dispatcher routes are about (another region's are dropped before).
          Sid       = "FindOwners"
          Effect    = "Allow"
          Action    = "ec2:DescribeInstances"
          Resource  = "*"
          Condition = local.in_region
        },
        {
          Sid       = "Metrics"
          Effect    = "Allow"
          Action    = "cloudwatch:PutMetricData"
          Resource  = "*"
          Condition = { StringEquals = { "cloudwatch:namespace" = "HealthRouter", "aws:RequestedRegion" = local.region } }
        },
        {
          Sid      = "Logs"
          Effect   = "Allow"
          Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
          Resource = "${aws_cloudwatch_log_group.dispatcher[0].arn}:*"
        },
      ],
      length(local.dispatcher_kms_key_arns) == 0 ? [] : [{
        # The keys only through SQS, in the regions of the queues it sends to.
        Sid       = "QueueKeys"
        Effect    = "Allow"
        Action    = ["kms:GenerateDataKey", "kms:Decrypt"]
        Resource  = local.dispatcher_kms_key_arns
        Condition = { StringEquals = { "kms:ViaService" = local.dispatcher_kms_via } }
      }],
    )
  })
}

resource "aws_cloudwatch_log_group" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  name              = "/aws/lambda/${local.dispatcher_name}"
  retention_in_days = var.dispatcher.log_retention_days

  tags = var.tags
}

resource "aws_lambda_function" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  function_name    = local.dispatcher_name
  description      = "Routes EC2 events to the intake queue of the EKS cluster that owns each instance"
  role             = aws_iam_role.dispatcher[0].arn
  runtime          = "provided.al2023"
  architectures    = ["arm64"]
  handler          = "bootstrap"
  filename         = var.dispatcher.zip_path
  source_code_hash = filebase64sha256(var.dispatcher.zip_path)
  memory_size      = var.dispatcher.memory_size
  timeout          = var.dispatcher.timeout

  environment {
    variables = {
      HEALTH_ROUTER_CLUSTER_QUEUES = jsonencode({ for cluster, q in local.dispatcher_queues : cluster => q.url })
      # Where the Lambda records each delivery it could not make, per cluster (the role may
      # send there already: ClusterQueues).
      HEALTH_ROUTER_FAILURE_QUEUE = aws_sqs_queue.dispatcher_failures[0].url
      # The account the dispatcher serves: an AWS Health event of the organizational view is
      # routed by its detail.affectedAccount (and detail.eventRegion, against the Lambda's own
      # region); one about another account or region is dropped and counted.
      HEALTH_ROUTER_ACCOUNT = local.account_id
    }
  }

  depends_on = [aws_cloudwatch_log_group.dispatcher, aws_iam_role_policy.dispatcher]

  tags = var.tags
}

# The Lambda records a failed delivery in the failure queue itself, per cluster; it fails the
# invocation only when a retry duplicates nothing (an outage before any delivery) or the record
# could not be made. Lambda then retries the async invocation; after the last retry the event
# and the error go to the failure queue, so nothing is lost.
resource "aws_lambda_function_event_invoke_config" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  function_name                = aws_lambda_function.dispatcher[0].function_name
  maximum_retry_attempts       = var.dispatcher.maximum_retry_attempts
  maximum_event_age_in_seconds = var.dispatcher.maximum_event_age_seconds

  destination_config {
    on_failure {
      destination = aws_sqs_queue.dispatcher_failures[0].arn
    }
  }
}

resource "aws_lambda_permission" "dispatcher" {
  for_each = toset(var.dispatcher.enabled ? keys(local.rules) : [])

  statement_id  = "AllowRule-${each.key}"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.dispatcher[0].function_name
  principal     = "events.amazonaws.com"
  source_arn    = aws_cloudwatch_event_rule.this[each.key].arn
}

resource "aws_cloudwatch_event_target" "dispatcher" {
  for_each = toset(var.dispatcher.enabled ? keys(local.rules) : [])

  rule           = aws_cloudwatch_event_rule.this[each.key].name
  event_bus_name = var.event_bus_name
  target_id      = "health-router-dispatcher"
  arn            = aws_lambda_function.dispatcher[0].arn

  retry_policy {
    maximum_event_age_in_seconds = 86400
    maximum_retry_attempts       = 185
  }

  dead_letter_config {
    arn = aws_sqs_queue.dispatcher_failures[0].arn
  }

  depends_on = [aws_lambda_permission.dispatcher]
}

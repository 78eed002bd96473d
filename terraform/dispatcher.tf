################################################################################
# Dispatcher: one regional rule set -> the dispatcher queue -> the Lambda -> each cluster's
# intake queue
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

# The rules send to this queue and an event source mapping feeds it to the Lambda: nothing
# invokes the Lambda directly. A Lambda permission for the rules would do, but a function's
# resource policy only adds grants: any principal of the account whose identity policy allows
# lambda:InvokeFunction (lambda:*, an admin) could then invoke the dispatcher with a forged
# event, which it would send under its own role, the one every cluster's intake queue admits.
# This queue's policy (main.tf, queue_policy_statements) denies sqs:SendMessage to every caller
# but EventBridge for this module's rules and dispatcher.sender_arns, whatever an identity
# policy allows.
resource "aws_sqs_queue" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  name = local.dispatcher_name

  message_retention_seconds = var.message_retention_seconds
  # Lambda needs at least the function's timeout and advises six times it, for retries of a
  # throttled batch; a record it fails comes back after this long.
  visibility_timeout_seconds        = 6 * var.dispatcher.timeout
  sqs_managed_sse_enabled           = local.sse_sqs ? true : null
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = local.sse_sqs ? null : var.kms_data_key_reuse_period_seconds

  # As the intake's: a record the Lambda fails (an outage) is retried up to max_receive_count
  # times, then kept in the failure queue with the dispatcher's other failures.
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dispatcher_failures[0].arn
    maxReceiveCount     = var.max_receive_count
  })

  tags = var.tags
}

resource "aws_sqs_queue_policy" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  queue_url = aws_sqs_queue.dispatcher[0].id
  policy    = jsonencode({ Version = "2012-10-17", Statement = local.queue_policy_statements.dispatcher })
}

# The failure queue gets three kinds of message: the Lambda's records of deliveries it could
# not make (the Lambda role sends those, with the reason in attributes), events EventBridge
# could not put in the dispatcher queue (the rules' dead-letter queue), and events the Lambda
# failed maxReceiveCount times (the dispatcher queue's redrive, which needs no grant).
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
          # Its own queue, through the event source mapping (which polls with this role).
          Sid      = "DispatcherQueue"
          Effect   = "Allow"
          Action   = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"]
          Resource = aws_sqs_queue.dispatcher[0].arn
        },
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

# The Lambda records a failed delivery in the failure queue itself, per cluster; it fails a
# record only when a retry duplicates nothing (an outage before any delivery) or the record
# could not be made. SQS then retries that record alone (ReportBatchItemFailures: the batch's
# other records are deleted, not delivered again) and after max_receive_count receives moves
# it to the failure queue, so nothing is lost.
resource "aws_lambda_event_source_mapping" "dispatcher" {
  count = var.dispatcher.enabled ? 1 : 0

  event_source_arn        = aws_sqs_queue.dispatcher[0].arn
  function_name           = aws_lambda_function.dispatcher[0].arn
  batch_size              = var.dispatcher.batch_size
  function_response_types = ["ReportBatchItemFailures"]

  # The mapping checks at creation that the role may read the queue.
  depends_on = [aws_iam_role_policy.dispatcher]
}

resource "aws_cloudwatch_event_target" "dispatcher" {
  for_each = toset(var.dispatcher.enabled ? keys(local.rules) : [])

  rule           = aws_cloudwatch_event_rule.this[each.key].name
  event_bus_name = var.event_bus_name
  target_id      = "health-router-dispatcher"
  arn            = aws_sqs_queue.dispatcher[0].arn

  retry_policy {
    maximum_event_age_in_seconds = 86400
    maximum_retry_attempts       = 185
  }

  dead_letter_config {
    arn = aws_sqs_queue.dispatcher_failures[0].arn
  }

  depends_on = [aws_sqs_queue_policy.dispatcher]
}

################################################################################
# Dashboard
################################################################################

locals {
  dashboard_body = templatefile("${path.module}/templates/dashboard.json.tftpl", {
    region             = local.region
    cluster_name       = var.cluster_name
    queue_name         = aws_sqs_queue.intake.name
    dlq_name           = aws_sqs_queue.dlq.name
    dispatcher_enabled = var.dispatcher.enabled
    function_name      = local.dispatcher_name
    failure_queue_name = "${local.name}-dispatcher-failures"
  })

  alarm_actions = var.alarm_sns_topic_arn == null ? [] : [var.alarm_sns_topic_arn]
}

resource "aws_cloudwatch_dashboard" "this" {
  count = var.create_dashboard ? 1 : 0

  dashboard_name = local.name
  dashboard_body = local.dashboard_body
}

################################################################################
# Alarms
#
# None of them fires on healthy deferrals: a deferred event is an invisible (in-flight) message,
# so it is not in ApproximateNumberOfMessagesVisible; it only goes to the DLQ if the router
# crashes on it max_receive_count times; and a router busy deferring still sends its Heartbeat.
# No alarm uses ApproximateAgeOfOldestMessage, which a deferred message inflates.
################################################################################

resource "aws_cloudwatch_metric_alarm" "dead_letters" {
  count = var.create_alarms ? 1 : 0

  alarm_name          = "${local.name}-dead-letters"
  alarm_description   = "health-router ${var.cluster_name}: messages in the dead-letter queue. The router dead-letters events it cannot parse or act on (reason in the message attributes); EventBridge puts events it could not deliver there. Inspect and redrive or delete."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.dlq.name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "intake_backlog" {
  count = var.create_alarms ? 1 : 0

  alarm_name          = "${local.name}-intake-backlog"
  alarm_description   = "health-router ${var.cluster_name}: visible messages stay in the intake queue, so the router is not keeping up or not receiving. Deferred events are invisible and do not count."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.intake.name }
  statistic           = "Minimum"
  period              = 300
  evaluation_periods  = var.backlog_alarm_evaluation_periods
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.backlog_alarm_threshold
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "router_silent" {
  count = var.create_alarms ? 1 : 0

  alarm_name          = "${local.name}-router-silent"
  alarm_description   = "health-router ${var.cluster_name}: no Heartbeat metric from the router. It is down, cannot reach CloudWatch, or lost its role. Events wait in the queue meanwhile, and Karpenter does not act on them either."
  namespace           = "HealthRouter"
  metric_name         = "Heartbeat"
  dimensions          = { ClusterName = var.cluster_name }
  statistic           = "Sum"
  period              = var.heartbeat_alarm_period_seconds
  evaluation_periods  = 1
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  treat_missing_data  = "breaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions

  tags = var.tags
}

resource "aws_cloudwatch_metric_alarm" "dispatcher_failures" {
  count = var.create_alarms && var.dispatcher.enabled ? 1 : 0

  alarm_name          = "${local.name}-dispatcher-failures"
  alarm_description   = "health-router dispatcher: deliveries the Lambda could not make, events EventBridge could not put in the dispatcher queue, or events the Lambda failed max_receive_count times are in the failure queue. A record of the Lambda holds the body to re-send and, in its attributes, the reason and the intake queue; a message without them is the event as EventBridge sent it."
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.dispatcher_failures[0].name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 1
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions

  tags = var.tags
}

# Plan-time checks of the module with a mocked AWS provider: no credentials, no network.
# override_during = plan makes the mocked computed values (ARNs, URLs) known during plan, so the
# policies and the dashboard can be inspected.

mock_provider "aws" {
  override_during = plan

  mock_data "aws_partition" {
    defaults = { partition = "aws", dns_suffix = "amazonaws.com" }
  }
  mock_data "aws_region" {
    defaults = { name = "eu-west-1" }
  }
  mock_data "aws_caller_identity" {
    defaults = { account_id = "111122223333" }
  }
  mock_resource "aws_sqs_queue" {
    defaults = {
      arn = "arn:aws:sqs:eu-west-1:111122223333:mocked-queue"
      url = "https://sqs.eu-west-1.amazonaws.com/111122223333/mocked-queue"
    }
  }
  mock_resource "aws_cloudwatch_event_rule" {
    defaults = { arn = "arn:aws:events:eu-west-1:111122223333:rule/mocked-rule" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::111122223333:role/mocked-role" }
  }
  mock_resource "aws_cloudwatch_log_group" {
    defaults = { arn = "arn:aws:logs:eu-west-1:111122223333:log-group:/aws/lambda/mocked" }
  }
  mock_resource "aws_lambda_function" {
    defaults = { arn = "arn:aws:lambda:eu-west-1:111122223333:function:mocked" }
  }
  mock_resource "aws_iam_policy" {
    defaults = { arn = "arn:aws:iam::111122223333:policy/mocked" }
  }
}

variables {
  cluster_name = "prod-eu"
}

run "defaults" {
  command = plan

  # No Karpenter role named: nothing to simulate, nothing for doctor to check.
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "InspectKarpenterRole"]) == 0 && output.karpenter_role_arn == null && !can(yamldecode(output.helm_values).settings.karpenterRoleARN)
    error_message = "without karpenter_controller_role_name the router may simulate no role's policies"
  }

  # Every kind gets a rule, each targeting the intake queue.
  assert {
    condition     = toset(keys(aws_cloudwatch_event_rule.this)) == toset(["scheduled-change", "spot-interruption", "rebalance-recommendation", "state-change", "capacity-reservation-interruption", "ami-state-change", "capacity-block-expiration"])
    error_message = "expected one rule per event kind"
  }
  assert {
    condition     = length(aws_cloudwatch_event_target.queue) == 7 && length(aws_cloudwatch_event_target.dispatcher) == 0
    error_message = "without the dispatcher every rule must target the intake queue"
  }
  assert {
    condition     = aws_cloudwatch_event_rule.this["spot-interruption"].name == "hr-prod-eu-spot-interruption"
    error_message = "rule names are <name>-<kind>, name defaulting to hr-<cluster_name>"
  }

  # The Health rule only lets EC2 scheduled changes through.
  assert {
    condition = jsondecode(aws_cloudwatch_event_rule.this["scheduled-change"].event_pattern) == {
      source        = ["aws.health"]
      "detail-type" = ["AWS Health Event"]
      detail        = { service = ["EC2"], eventTypeCategory = ["scheduledChange"] }
    }
    error_message = "the Health pattern must be filtered to service EC2 and category scheduledChange"
  }
  assert {
    condition     = jsondecode(aws_cloudwatch_event_rule.this["capacity-reservation-interruption"].event_pattern)["detail-type"] == ["EC2 Capacity Reservation Instance Interruption Warning"]
    error_message = "capacity reservation rule has the wrong detail-type"
  }
  assert {
    condition     = jsondecode(aws_cloudwatch_event_rule.this["capacity-block-expiration"].event_pattern)["detail-type"] == ["Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning"]
    error_message = "the Capacity Block rule must match the detail-types EC2 sends (EventBridge's reference: Capacity Block Expiration Warning, no EC2 prefix; some of EC2's samples: Capacity Block Reservation Expiration Warning)"
  }

  # SSE on, SQS-managed by default; 14-day retention; redrive to the DLQ.
  assert {
    condition     = aws_sqs_queue.intake.sqs_managed_sse_enabled && aws_sqs_queue.dlq.sqs_managed_sse_enabled && aws_sqs_queue.intake.kms_master_key_id == null
    error_message = "queues must use SSE-SQS when no KMS key is given"
  }
  assert {
    condition     = aws_sqs_queue.intake.message_retention_seconds == 1209600
    error_message = "intake retention must default to 14 days"
  }
  assert {
    condition     = jsondecode(aws_sqs_queue.intake.redrive_policy).deadLetterTargetArn == aws_sqs_queue.dlq.arn && jsondecode(aws_sqs_queue.intake.redrive_policy).maxReceiveCount == 100
    error_message = "intake must redrive to the DLQ"
  }

  # Only the module's rules may send as EventBridge; no access without TLS.
  assert {
    condition     = one([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement : s if s.Sid == "AllowHealthRouterRules"]).Condition.ArnEquals["aws:SourceArn"] == [for r in aws_cloudwatch_event_rule.this : r.arn]
    error_message = "the intake queue policy must allow exactly the module's rule ARNs"
  }
  assert {
    condition     = one([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement : s if s.Effect == "Allow"]).Principal.Service == "events.amazonaws.com"
    error_message = "the only Allow in the queue policy must be for EventBridge"
  }
  assert {
    condition     = one([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement : s if s.Sid == "DenyOtherRules"]).Condition.ArnNotEquals["aws:SourceArn"] == [for r in aws_cloudwatch_event_rule.this : r.arn]
    error_message = "other rules must be denied"
  }
  assert {
    condition     = one([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement : s if s.Sid == "DenyInsecureTransport"]).Condition.Bool["aws:SecureTransport"] == "false"
    error_message = "the queue policy must deny non-TLS access"
  }
  assert {
    condition     = length([for s in jsondecode(aws_sqs_queue_policy.dlq.policy).Statement : s if s.Sid == "DenyInsecureTransport"]) == 1
    error_message = "the DLQ policy must deny non-TLS access"
  }

  # Pod Identity trust, least-privilege permissions.
  assert {
    condition     = jsondecode(aws_iam_role.router[0].assume_role_policy).Statement[0].Principal.Service == "pods.eks.amazonaws.com" && toset(jsondecode(aws_iam_role.router[0].assume_role_policy).Statement[0].Action) == toset(["sts:AssumeRole", "sts:TagSession"])
    error_message = "default trust must be EKS Pod Identity with AssumeRole and TagSession"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "IntakeQueue"]).Resource == aws_sqs_queue.intake.arn
    error_message = "the intake queue's permissions must be scoped to the intake queue (the DLQ has a statement of its own; tests/policies.tftest.hcl tells them apart)"
  }
  assert {
    condition     = !contains(one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "IntakeQueue"]).Action, "sqs:SendMessage") && one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "DeadLetter"]).Resource == aws_sqs_queue.dlq.arn
    error_message = "the router sends to the dead-letter queue only: deferrals are not re-sent to the intake"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "Metrics"]).Condition.StringEquals["cloudwatch:namespace"] == "HealthRouter"
    error_message = "PutMetricData must be limited to the HealthRouter namespace"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if contains(["ForwardToKarpenter", "QueueKey"], s.Sid)]) == 0
    error_message = "no Karpenter or KMS permission unless asked for"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "InstanceStatusPoller"]).Action == "ec2:DescribeInstanceStatus" && one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "InstanceStatusPoller"]).Effect == "Allow"
    error_message = "the router's instance-status poller needs ec2:DescribeInstanceStatus, and that action only"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if contains(flatten([s.Action]), "ec2:DescribeInstanceStatus")]) == 1
    error_message = "ec2:DescribeInstanceStatus is granted in one statement only"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if contains(flatten([s.Action]), "ec2:ModifyInstanceEventStartTime") || s.Sid == "RescheduleEvents"]) == 0
    error_message = "no ec2:ModifyInstanceEventStartTime unless enable_reschedule"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if contains(flatten([s.Action]), "ec2:RebootInstances") || s.Sid == "RebootInPlace"]) == 0
    error_message = "no ec2:RebootInstances unless enable_reboot_in_place"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if length([for a in flatten([s.Action]) : a if strcontains(a, "InstanceEventWindow") || a == "ec2:CreateTags"]) > 0 || startswith(s.Sid, "EventWindows")]) == 0
    error_message = "no event-window call and no ec2:CreateTags unless enable_event_windows"
  }
  assert {
    condition     = alltrue([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : !contains(flatten([s.Action]), "sqs:*") && !contains(flatten([s.Action]), "*")])
    error_message = "no wildcard actions in the router policy"
  }

  # Dashboard JSON parses and has the base widgets only; three alarms.
  assert {
    condition     = length(jsondecode(aws_cloudwatch_dashboard.this[0].dashboard_body).widgets) == 10
    error_message = "the dashboard must be valid JSON with 10 widgets without the dispatcher"
  }
  assert {
    condition = output.router_environment == {
      HEALTH_ROUTER_QUEUE_URL             = aws_sqs_queue.intake.url
      HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL = aws_sqs_queue.dlq.url
      HEALTH_ROUTER_REGION                = "eu-west-1"
      HEALTH_ROUTER_ACCOUNT               = "111122223333"
      HEALTH_ROUTER_CLOUDWATCH_METRICS    = "true"
      HEALTH_ROUTER_CLUSTER_NAME          = "prod-eu"
    }
    error_message = "router_environment must carry the queues and the metric settings, and no Karpenter queue unless given"
  }
  assert {
    condition = yamldecode(output.helm_values) == {
      serviceAccount = { name = "health-router" }
      settings = {
        queueURL           = aws_sqs_queue.intake.url
        deadLetterQueueURL = aws_sqs_queue.dlq.url
        region             = "eu-west-1"
        account            = "111122223333"
        clusterName        = "prod-eu"
        cloudWatchMetrics  = true
      }
    }
    error_message = "helm_values must carry the chart's settings and, with Pod Identity, only the ServiceAccount's name"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.router_silent[0].treat_missing_data == "breaching" && aws_cloudwatch_metric_alarm.router_silent[0].dimensions.ClusterName == "prod-eu" && aws_cloudwatch_metric_alarm.router_silent[0].period == 900
    error_message = "router-silent must treat missing heartbeats as breaching over 15 minutes"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.dead_letters[0].dimensions.QueueName == aws_sqs_queue.dlq.name && aws_cloudwatch_metric_alarm.dead_letters[0].threshold == 0
    error_message = "dead-letters alarm must watch the DLQ for any message"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.intake_backlog[0].metric_name == "ApproximateNumberOfMessagesVisible"
    error_message = "the backlog alarm must count visible messages only (deferred ones are invisible)"
  }
  assert {
    condition     = length(aws_cloudwatch_metric_alarm.dispatcher_failures) == 0 && length(aws_lambda_function.dispatcher) == 0
    error_message = "no dispatcher resources unless enabled"
  }
}

run "irsa_kms_forward_and_karpenter_deny" {
  command = plan

  variables {
    name                           = "hr-irsa"
    identity_type                  = "irsa"
    oidc_provider_arn              = "arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF"
    kms_key_arn                    = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    karpenter_queue_arn            = "arn:aws:sqs:eu-west-1:111122223333:Karpenter-prod-eu"
    create_karpenter_deny_policy   = true
    karpenter_controller_role_name = "KarpenterController-prod-eu"
    alarm_sns_topic_arn            = "arn:aws:sns:eu-west-1:111122223333:oncall"
    rules                          = { rebalance_recommendation = false, ami_state_change = false }
  }

  assert {
    condition     = jsondecode(aws_iam_role.router[0].assume_role_policy).Statement[0].Condition.StringEquals["oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF:sub"] == "system:serviceaccount:health-router:health-router"
    error_message = "IRSA trust must be limited to the router's service account"
  }
  assert {
    condition     = aws_sqs_queue.intake.kms_master_key_id == var.kms_key_arn && !coalesce(aws_sqs_queue.intake.sqs_managed_sse_enabled, false)
    error_message = "with a KMS key the queues must use SSE-KMS"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "QueueKey"]).Resource == var.kms_key_arn
    error_message = "the router needs the queue key"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "ForwardToKarpenter"]).Resource == var.karpenter_queue_arn
    error_message = "forward mode needs SendMessage on Karpenter's queue"
  }
  assert {
    condition     = jsondecode(aws_iam_policy.karpenter_deny_instance_status[0].policy).Statement[0].Effect == "Deny" && jsondecode(aws_iam_policy.karpenter_deny_instance_status[0].policy).Statement[0].Action == "ec2:DescribeInstanceStatus"
    error_message = "the Karpenter policy must deny DescribeInstanceStatus"
  }
  assert {
    condition     = output.router_environment.HEALTH_ROUTER_KARPENTER_QUEUE_URL == "https://sqs.eu-west-1.amazonaws.com/111122223333/Karpenter-prod-eu"
    error_message = "the router needs Karpenter's queue as a URL"
  }
  assert {
    condition     = output.karpenter_queue_url == "https://sqs.eu-west-1.amazonaws.com/111122223333/Karpenter-prod-eu"
    error_message = "handback --karpenter-queue-url needs Karpenter's queue as a URL, an output of its own"
  }
  assert {
    condition     = yamldecode(output.helm_values).settings.karpenterQueueURL == "https://sqs.eu-west-1.amazonaws.com/111122223333/Karpenter-prod-eu" && yamldecode(output.helm_values).serviceAccount.annotations["eks.amazonaws.com/role-arn"] == aws_iam_role.router[0].arn
    error_message = "with IRSA and forward mode, helm_values must carry the role ARN annotation and Karpenter's queue"
  }
  assert {
    condition     = aws_iam_role_policy_attachment.karpenter_deny_instance_status[0].role == "KarpenterController-prod-eu"
    error_message = "the deny policy must be attached to Karpenter's role when named"
  }
  # Issue 38 item 10: the in-pod doctor can say "takeover from Karpenter: complete" only when it
  # knows Karpenter's role and may simulate its policies.
  assert {
    condition     = yamldecode(output.helm_values).settings.karpenterRoleARN == "arn:aws:iam::111122223333:role/KarpenterController-prod-eu" && output.karpenter_role_arn == "arn:aws:iam::111122223333:role/KarpenterController-prod-eu"
    error_message = "helm_values must carry Karpenter's role ARN for doctor's takeover check"
  }
  assert {
    condition = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "InspectKarpenterRole"]).Action == "iam:SimulatePrincipalPolicy" && toset(one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "InspectKarpenterRole"]).Resource) == toset([
      "arn:aws:iam::111122223333:role/KarpenterController-prod-eu", "arn:aws:iam::111122223333:role/*/KarpenterController-prod-eu",
    ])
    error_message = "the router may simulate Karpenter's role's policies, and no other role's"
  }
  assert {
    condition     = !contains(keys(aws_cloudwatch_event_rule.this), "rebalance-recommendation") && !contains(keys(aws_cloudwatch_event_rule.this), "ami-state-change") && length(aws_cloudwatch_event_rule.this) == 5
    error_message = "disabled kinds must have no rule"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.router_silent[0].alarm_actions == toset(["arn:aws:sns:eu-west-1:111122223333:oncall"])
    error_message = "alarms must notify the SNS topic"
  }
}

run "reschedule" {
  command = plan

  variables {
    enable_reschedule = true
  }

  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "RescheduleEvents"]).Action == "ec2:ModifyInstanceEventStartTime" && one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "RescheduleEvents"]).Effect == "Allow"
    error_message = "enable_reschedule must grant ec2:ModifyInstanceEventStartTime, and that action only"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if contains(flatten([s.Action]), "ec2:ModifyInstanceEventStartTime")]) == 1
    error_message = "ec2:ModifyInstanceEventStartTime is granted in one statement only"
  }
  assert {
    condition     = toset([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s.Sid]) == toset(["IntakeQueue", "DeadLetter", "PreDrainChecks", "InstanceStatusPoller", "Metrics", "InspectRules", "RescheduleEvents"])
    error_message = "enable_reschedule adds one statement and changes no other"
  }
}

# The event windows: every call the router's manager makes, each scoped as far as AWS allows:
# windows created only with this cluster's tag and a pool's, and no other tag, and changed only
# when they carry both (issue 38, item 7), the read held to the region, and the instance tag
# alone, with this cluster's value, on this cluster's Karpenter instances. What a window is
# associated with no IAM condition scopes (router/eventwindow takes strays off).
run "event_windows" {
  command = plan

  variables {
    enable_event_windows = true
  }

  assert {
    condition = { for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement :
      s.Sid => { effect = s.Effect, actions = toset(flatten([s.Action])), resource = s.Resource, condition = s.Condition }
      if startswith(s.Sid, "EventWindows")
      } == {
      EventWindowsCreate = {
        effect   = "Allow", actions = toset(["ec2:CreateInstanceEventWindow"])
        resource = "arn:aws:ec2:eu-west-1:111122223333:instance-event-window/*"
        condition = {
          StringEquals                = { "aws:RequestTag/healthrouter.io/cluster" = "prod-eu" }
          StringLike                  = { "aws:RequestTag/healthrouter.io/nodepool" = "?*" }
          "ForAllValues:StringEquals" = { "aws:TagKeys" = ["healthrouter.io/cluster", "healthrouter.io/nodepool"] }
        }
      }
      EventWindowsTagOnCreate = {
        effect   = "Allow", actions = toset(["ec2:CreateTags"])
        resource = "arn:aws:ec2:eu-west-1:111122223333:instance-event-window/*"
        condition = {
          StringEquals                = { "ec2:CreateAction" = "CreateInstanceEventWindow", "aws:RequestTag/healthrouter.io/cluster" = "prod-eu" }
          StringLike                  = { "aws:RequestTag/healthrouter.io/nodepool" = "?*" }
          "ForAllValues:StringEquals" = { "aws:TagKeys" = ["healthrouter.io/cluster", "healthrouter.io/nodepool"] }
        }
      }
      EventWindowsManage = {
        effect   = "Allow"
        actions  = toset(["ec2:ModifyInstanceEventWindow", "ec2:AssociateInstanceEventWindow", "ec2:DisassociateInstanceEventWindow", "ec2:DeleteInstanceEventWindow"])
        resource = "arn:aws:ec2:eu-west-1:111122223333:instance-event-window/*"
        condition = {
          StringEquals = { "aws:ResourceTag/healthrouter.io/cluster" = "prod-eu" }
          StringLike   = { "aws:ResourceTag/healthrouter.io/nodepool" = "?*" }
        }
      }
      EventWindowsDescribe = {
        effect    = "Allow", actions = toset(["ec2:DescribeInstanceEventWindows"])
        resource  = "*"
        condition = { StringEquals = { "aws:RequestedRegion" = "eu-west-1" } }
      }
      EventWindowsTagInstances = {
        effect   = "Allow", actions = toset(["ec2:CreateTags"])
        resource = "arn:aws:ec2:eu-west-1:111122223333:instance/*"
        condition = {
          StringEquals                = { "aws:ResourceTag/kubernetes.io/cluster/prod-eu" = "owned" }
          StringLike                  = { "aws:ResourceTag/karpenter.sh/nodepool" = "*", "aws:RequestTag/healthrouter.io/event-window" = "prod-eu/*" }
          "ForAllValues:StringEquals" = { "aws:TagKeys" = ["healthrouter.io/event-window"] }
        }
      }
    }
    error_message = "enable_event_windows must grant the event-window calls and the instance tag, each scoped to this cluster as far as AWS allows, and nothing more"
  }
  assert {
    condition     = toset([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s.Sid]) == toset(["IntakeQueue", "DeadLetter", "PreDrainChecks", "InstanceStatusPoller", "Metrics", "InspectRules", "EventWindowsCreate", "EventWindowsTagOnCreate", "EventWindowsManage", "EventWindowsDescribe", "EventWindowsTagInstances"])
    error_message = "enable_event_windows adds its statements and changes no other"
  }
}

run "reboot_in_place" {
  command = plan

  variables {
    enable_reboot_in_place = true
  }

  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "RebootInPlace"]).Action == "ec2:RebootInstances" && one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "RebootInPlace"]).Effect == "Allow"
    error_message = "enable_reboot_in_place must grant ec2:RebootInstances, and that action only"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "RebootMigration"]).Action == "ec2:DescribeInstances" && one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s if s.Sid == "RebootMigration"]).Effect == "Allow"
    error_message = "enable_reboot_in_place must grant ec2:DescribeInstances (reboot migration), and that action only"
  }
  assert {
    condition     = toset([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s.Sid]) == toset(["IntakeQueue", "DeadLetter", "PreDrainChecks", "InstanceStatusPoller", "Metrics", "InspectRules", "RebootInPlace", "RebootMigration"])
    error_message = "enable_reboot_in_place adds two statements and changes no other"
  }
}

run "dispatcher" {
  command = plan

  variables {
    name = "hr-dispatch"
    dispatcher = {
      enabled  = true
      zip_path = "tests/fixtures/dispatcher.zip"
      cluster_queues = {
        "batch-eu" = { url = "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-batch-eu", arn = "arn:aws:sqs:eu-west-1:111122223333:hr-batch-eu" }
        "batch-us" = { url = "https://sqs.us-east-1.amazonaws.com/111122223333/hr-batch-us", arn = "arn:aws:sqs:us-east-1:111122223333:hr-batch-us" }
      }
      kms_key_arns = ["arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ac"]
    }
  }

  override_resource {
    target          = aws_sqs_queue.dispatcher
    override_during = plan
    values = {
      arn = "arn:aws:sqs:eu-west-1:111122223333:hr-dispatch-dispatcher"
      url = "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-dispatch-dispatcher"
    }
  }
  override_resource {
    target          = aws_sqs_queue.dispatcher_failures
    override_during = plan
    values = {
      arn = "arn:aws:sqs:eu-west-1:111122223333:hr-dispatch-dispatcher-failures"
      url = "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-dispatch-dispatcher-failures"
    }
  }

  # Issue 38, 1: the rules send to the dispatcher queue, which an event source mapping feeds to
  # the Lambda; nothing invokes the Lambda directly (no aws_lambda_permission: TestNoDirectInvoke
  # in test/terraform, and the moto apply, check that).
  assert {
    condition     = length(aws_cloudwatch_event_target.dispatcher) == 7 && length(aws_cloudwatch_event_target.queue) == 0 && alltrue([for t in aws_cloudwatch_event_target.dispatcher : t.arn == "arn:aws:sqs:eu-west-1:111122223333:hr-dispatch-dispatcher"])
    error_message = "with the dispatcher every rule must target the dispatcher queue (not the Lambda)"
  }
  assert {
    condition     = alltrue([for t in aws_cloudwatch_event_target.dispatcher : t.dead_letter_config[0].arn == "arn:aws:sqs:eu-west-1:111122223333:hr-dispatch-dispatcher-failures"])
    error_message = "events EventBridge cannot put in the dispatcher queue must go to the failure queue"
  }
  assert {
    condition = (aws_lambda_event_source_mapping.dispatcher[0].event_source_arn == "arn:aws:sqs:eu-west-1:111122223333:hr-dispatch-dispatcher" &&
      aws_lambda_event_source_mapping.dispatcher[0].function_name == aws_lambda_function.dispatcher[0].arn &&
      aws_lambda_event_source_mapping.dispatcher[0].batch_size == 10 &&
    toset(aws_lambda_event_source_mapping.dispatcher[0].function_response_types) == toset(["ReportBatchItemFailures"]))
    error_message = "an event source mapping must feed the dispatcher queue to the Lambda, batches of 10, with partial batch failures (ReportBatchItemFailures)"
  }
  assert {
    condition = (aws_sqs_queue.dispatcher[0].sqs_managed_sse_enabled == true &&
      aws_sqs_queue.dispatcher[0].message_retention_seconds == aws_sqs_queue.intake.message_retention_seconds &&
      aws_sqs_queue.dispatcher[0].visibility_timeout_seconds == 180 &&
    jsondecode(aws_sqs_queue.dispatcher[0].redrive_policy) == { deadLetterTargetArn = "arn:aws:sqs:eu-west-1:111122223333:hr-dispatch-dispatcher-failures", maxReceiveCount = 100 })
    error_message = "the dispatcher queue: SSE on, the intake's retention, six Lambda timeouts of visibility, redrive to the failure queue after max_receive_count"
  }
  assert {
    condition     = aws_lambda_function.dispatcher[0].runtime == "provided.al2023" && aws_lambda_function.dispatcher[0].architectures == tolist(["arm64"]) && aws_lambda_function.dispatcher[0].handler == "bootstrap"
    error_message = "the dispatcher is a provided.al2023 arm64 bootstrap function"
  }
  assert {
    condition     = jsondecode(aws_lambda_function.dispatcher[0].environment[0].variables.HEALTH_ROUTER_CLUSTER_QUEUES) == { "prod-eu" = aws_sqs_queue.intake.url, "batch-eu" = "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-batch-eu", "batch-us" = "https://sqs.us-east-1.amazonaws.com/111122223333/hr-batch-us" }
    error_message = "the Lambda must know every cluster's queue, its own included"
  }
  assert {
    condition     = aws_lambda_function.dispatcher[0].environment[0].variables.HEALTH_ROUTER_ACCOUNT == "111122223333"
    error_message = "the Lambda must know the account it serves, to route the organizational view by detail.affectedAccount"
  }
  # EventBridge no longer sends to the intake queue: only the Lambda (through IAM) does.
  assert {
    condition     = length([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement : s if s.Effect == "Allow"]) == 0 && length([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement : s if s.Sid == "DenyAllRules"]) == 1
    error_message = "with the dispatcher the intake queue must accept no EventBridge rule"
  }
  assert {
    condition     = contains(one([for s in jsondecode(aws_iam_role_policy.dispatcher[0].policy).Statement : s if s.Sid == "ClusterQueues"]).Resource, "arn:aws:sqs:eu-west-1:111122223333:hr-batch-eu")
    error_message = "the Lambda must be allowed to send to the other clusters' queues"
  }
  # Issue 38, 7: the dispatcher's reads and metrics held to the region; its keys used through SQS only.
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.dispatcher[0].policy).Statement : s if s.Sid == "FindOwners"]).Condition.StringEquals["aws:RequestedRegion"] == "eu-west-1"
    error_message = "the dispatcher's ec2:DescribeInstances must be held to the module's region"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.dispatcher[0].policy).Statement : s if s.Sid == "Metrics"]).Condition.StringEquals == { "cloudwatch:namespace" = "HealthRouter", "aws:RequestedRegion" = "eu-west-1" }
    error_message = "the dispatcher's cloudwatch:PutMetricData must be held to its namespace and the module's region"
  }
  assert {
    condition     = toset(one([for s in jsondecode(aws_iam_role_policy.dispatcher[0].policy).Statement : s if s.Sid == "QueueKeys"]).Condition.StringEquals["kms:ViaService"]) == toset(["sqs.eu-west-1.amazonaws.com", "sqs.us-east-1.amazonaws.com"])
    error_message = "the dispatcher may use its queues' KMS keys only through SQS in their regions (kms:ViaService)"
  }
  assert {
    condition     = length(jsondecode(aws_cloudwatch_dashboard.this[0].dashboard_body).widgets) == 14
    error_message = "the dashboard with the dispatcher must be valid JSON with 14 widgets"
  }
}

# Who may do what, read from the policy documents the module plans: who may send to each queue,
# which actions the router's role has on which resources under which conditions, and who may
# assume the role. Plan only, with a mocked provider; every queue and role gets an ARN of its own
# (override_resource below) so that a grant on the wrong one shows.
#
# The queue-policy assertions evaluate the statements for a list of callers rather than compare
# the JSON: a caller is an IAM request context (the keys AWS would set for that request), and the
# small evaluator in each assertion applies the condition operators the module uses, with IAM's
# rule that a negated operator (StringNotEquals, ArnNotEquals) matches when its key is absent. An
# operator it does not know fails the assertion (tobool of a string), so a new one must be taught
# to it before it is trusted.

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
    defaults = { arn = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule" }
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

override_resource {
  target          = aws_sqs_queue.intake
  override_during = plan
  values = {
    arn = "arn:aws:sqs:eu-west-1:111122223333:hr-prod-eu"
    url = "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-prod-eu"
  }
}

override_resource {
  target          = aws_sqs_queue.dlq
  override_during = plan
  values = {
    arn = "arn:aws:sqs:eu-west-1:111122223333:hr-prod-eu-dlq"
    url = "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-prod-eu-dlq"
  }
}

override_resource {
  target          = aws_iam_role.router
  override_during = plan
  values          = { arn = "arn:aws:iam::111122223333:role/hr-prod-eu-router" }
}

override_resource {
  target          = aws_iam_role.dispatcher
  override_during = plan
  values          = { arn = "arn:aws:iam::111122223333:role/hr-prod-eu-dispatcher" }
}

variables {
  cluster_name = "prod-eu"
}

# Who may send to the intake queue and the DLQ when the rules target the intake queue.
run "queue_senders" {
  command = plan

  # The intake queue: EventBridge for this module's rules, nobody else; not even the router's own
  # role (it never sends there: a deferral is a record on the NodeClaim).
  assert {
    condition = alltrue([for c in [
      { denied = false, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/someone-elses", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-router", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/Admin", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:user/ci", "aws:SecureTransport" = "true" } },
      { denied = true, service = "sns.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "sns.amazonaws.com", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "false" } },
      ] : c.denied == anytrue([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement :
        s.Effect == "Deny" &&
        length(setintersection(toset(flatten([s.Action])), ["sqs:SendMessage", "sqs:*", "*"])) > 0 &&
        (s.Principal == "*" || try(s.Principal.AWS, "") == "*" || try(s.Principal.Service, "") == c.service) &&
        alltrue([for op, kv in try(s.Condition, {}) : alltrue([for k, v in kv :
          lookup(c.ctx, k, null) == null ? contains(["StringNotEquals", "ArnNotEquals"], op) :
          contains(["StringEquals", "ArnEquals", "Bool"], op) ? contains(flatten([v]), c.ctx[k]) :
          contains(["StringNotEquals", "ArnNotEquals"], op) ? !contains(flatten([v]), c.ctx[k]) :
          tobool("operator ${op} unknown to this test")
        ])])
    ])])
    error_message = "the intake queue must deny sqs:SendMessage to every caller but EventBridge for this module's rules (over TLS)"
  }
  # EventBridge is a service principal: it needs an Allow in the queue policy, for these rules only.
  assert {
    condition = [for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement : s.Condition if s.Effect == "Allow"] == [
      { ArnEquals = { "aws:SourceArn" = [for r in aws_cloudwatch_event_rule.this : r.arn] } }
    ]
    error_message = "the intake queue policy's one Allow is EventBridge's, pinned to the module's rules"
  }

  # The DLQ: the router's role (dead letters) and EventBridge for this module's rules (the
  # rules' target dead-letter queue), nobody else.
  assert {
    condition = alltrue([for c in [
      { denied = false, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-router", "aws:SecureTransport" = "true" } },
      { denied = false, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/someone-elses", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/Admin", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-dispatcher", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-router", "aws:SecureTransport" = "false" } },
      ] : c.denied == anytrue([for s in jsondecode(aws_sqs_queue_policy.dlq.policy).Statement :
        s.Effect == "Deny" &&
        length(setintersection(toset(flatten([s.Action])), ["sqs:SendMessage", "sqs:*", "*"])) > 0 &&
        (s.Principal == "*" || try(s.Principal.AWS, "") == "*" || try(s.Principal.Service, "") == c.service) &&
        alltrue([for op, kv in try(s.Condition, {}) : alltrue([for k, v in kv :
          lookup(c.ctx, k, null) == null ? contains(["StringNotEquals", "ArnNotEquals"], op) :
          contains(["StringEquals", "ArnEquals", "Bool"], op) ? contains(flatten([v]), c.ctx[k]) :
          contains(["StringNotEquals", "ArnNotEquals"], op) ? !contains(flatten([v]), c.ctx[k]) :
          tobool("operator ${op} unknown to this test")
        ])])
    ])])
    error_message = "the DLQ must deny sqs:SendMessage to every caller but the router's role and EventBridge for this module's rules (over TLS)"
  }
}

# Dispatcher mode: the dispatcher's role sends to the intake queue, EventBridge does not.
run "queue_senders_dispatcher" {
  command = plan

  variables {
    dispatcher = {
      enabled  = true
      zip_path = "tests/fixtures/dispatcher.zip"
    }
  }

  assert {
    condition = alltrue([for c in [
      { denied = false, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-dispatcher", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-router", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/Admin", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-dispatcher", "aws:SecureTransport" = "false" } },
      ] : c.denied == anytrue([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement :
        s.Effect == "Deny" &&
        length(setintersection(toset(flatten([s.Action])), ["sqs:SendMessage", "sqs:*", "*"])) > 0 &&
        (s.Principal == "*" || try(s.Principal.AWS, "") == "*" || try(s.Principal.Service, "") == c.service) &&
        alltrue([for op, kv in try(s.Condition, {}) : alltrue([for k, v in kv :
          lookup(c.ctx, k, null) == null ? contains(["StringNotEquals", "ArnNotEquals"], op) :
          contains(["StringEquals", "ArnEquals", "Bool"], op) ? contains(flatten([v]), c.ctx[k]) :
          contains(["StringNotEquals", "ArnNotEquals"], op) ? !contains(flatten([v]), c.ctx[k]) :
          tobool("operator ${op} unknown to this test")
        ])])
    ])])
    error_message = "in dispatcher mode the intake queue must deny sqs:SendMessage to every caller but the dispatcher's role"
  }
  # The DLQ is no rule's dead-letter queue in dispatcher mode (the failure queue is).
  assert {
    condition = alltrue([for c in [
      { denied = false, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-router", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-dispatcher", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "true" } },
      ] : c.denied == anytrue([for s in jsondecode(aws_sqs_queue_policy.dlq.policy).Statement :
        s.Effect == "Deny" &&
        length(setintersection(toset(flatten([s.Action])), ["sqs:SendMessage", "sqs:*", "*"])) > 0 &&
        (s.Principal == "*" || try(s.Principal.AWS, "") == "*" || try(s.Principal.Service, "") == c.service) &&
        alltrue([for op, kv in try(s.Condition, {}) : alltrue([for k, v in kv :
          lookup(c.ctx, k, null) == null ? contains(["StringNotEquals", "ArnNotEquals"], op) :
          contains(["StringEquals", "ArnEquals", "Bool"], op) ? contains(flatten([v]), c.ctx[k]) :
          contains(["StringNotEquals", "ArnNotEquals"], op) ? !contains(flatten([v]), c.ctx[k]) :
          tobool("operator ${op} unknown to this test")
        ])])
    ])])
    error_message = "in dispatcher mode the DLQ must deny sqs:SendMessage to every caller but the router's role"
  }
  # The dispatcher's role is an output, for the other clusters' extra_sender_arns.
  assert {
    condition     = output.dispatcher_role_arn == "arn:aws:iam::111122223333:role/hr-prod-eu-dispatcher"
    error_message = "dispatcher_role_arn must name the dispatcher's role"
  }
}

# A cluster fed by another module instance's dispatcher, with a role that redrives dead letters
# back, and a router role it brings itself.
run "queue_senders_listed" {
  command = plan

  variables {
    rules                         = { scheduled_change = false, spot_interruption = false, rebalance_recommendation = false, state_change = false, capacity_reservation_interruption = false, ami_state_change = false, capacity_block_expiration = false }
    extra_sender_arns             = ["arn:aws:iam::111122223333:role/hr-other-dispatcher", "arn:aws:iam::111122223333:role/oncall"]
    create_iam_role               = false
    extra_dead_letter_sender_arns = ["arn:aws:iam::111122223333:role/my-router"]
  }

  assert {
    condition = alltrue([for c in [
      { denied = false, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-other-dispatcher", "aws:SecureTransport" = "true" } },
      { denied = false, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/oncall", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/my-router", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/Admin", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "true" } },
      ] : c.denied == anytrue([for s in jsondecode(aws_sqs_queue_policy.intake.policy).Statement :
        s.Effect == "Deny" &&
        length(setintersection(toset(flatten([s.Action])), ["sqs:SendMessage", "sqs:*", "*"])) > 0 &&
        (s.Principal == "*" || try(s.Principal.AWS, "") == "*" || try(s.Principal.Service, "") == c.service) &&
        alltrue([for op, kv in try(s.Condition, {}) : alltrue([for k, v in kv :
          lookup(c.ctx, k, null) == null ? contains(["StringNotEquals", "ArnNotEquals"], op) :
          contains(["StringEquals", "ArnEquals", "Bool"], op) ? contains(flatten([v]), c.ctx[k]) :
          contains(["StringNotEquals", "ArnNotEquals"], op) ? !contains(flatten([v]), c.ctx[k]) :
          tobool("operator ${op} unknown to this test")
        ])])
    ])])
    error_message = "the intake queue must let the callers of extra_sender_arns send, and deny every other"
  }
  assert {
    condition = alltrue([for c in [
      { denied = false, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/my-router", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/oncall", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-router", "aws:SecureTransport" = "true" } },
      ] : c.denied == anytrue([for s in jsondecode(aws_sqs_queue_policy.dlq.policy).Statement :
        s.Effect == "Deny" &&
        length(setintersection(toset(flatten([s.Action])), ["sqs:SendMessage", "sqs:*", "*"])) > 0 &&
        (s.Principal == "*" || try(s.Principal.AWS, "") == "*" || try(s.Principal.Service, "") == c.service) &&
        alltrue([for op, kv in try(s.Condition, {}) : alltrue([for k, v in kv :
          lookup(c.ctx, k, null) == null ? contains(["StringNotEquals", "ArnNotEquals"], op) :
          contains(["StringEquals", "ArnEquals", "Bool"], op) ? contains(flatten([v]), c.ctx[k]) :
          contains(["StringNotEquals", "ArnNotEquals"], op) ? !contains(flatten([v]), c.ctx[k]) :
          tobool("operator ${op} unknown to this test")
        ])])
    ])])
    error_message = "without the module's router role, the DLQ must let extra_dead_letter_sender_arns send, and deny every other"
  }
}

# Nobody listed at all: every IAM principal is denied, and no condition carries an empty list
# (IAM rejects a policy whose condition has no value).
run "queue_senders_none" {
  command = plan

  variables {
    rules           = { scheduled_change = false, spot_interruption = false, rebalance_recommendation = false, state_change = false, capacity_reservation_interruption = false, ami_state_change = false, capacity_block_expiration = false }
    create_iam_role = false
  }

  assert {
    condition = alltrue(flatten([for p in [aws_sqs_queue_policy.intake.policy, aws_sqs_queue_policy.dlq.policy] : [
      for s in jsondecode(p).Statement : [for op, kv in try(s.Condition, {}) : [for k, v in kv : length(flatten([v])) > 0]]
    ]]))
    error_message = "no condition may have an empty list of values"
  }
  assert {
    condition = alltrue([for p in [aws_sqs_queue_policy.intake.policy, aws_sqs_queue_policy.dlq.policy] :
      anytrue([for s in jsondecode(p).Statement : s.Effect == "Deny" && s.Principal == "*" && s.Action == "sqs:SendMessage" && try(s.Condition, null) == { StringNotEquals = { "aws:PrincipalServiceName" = "events.amazonaws.com" } }])
    ])
    error_message = "with no sender listed, both queues must deny sqs:SendMessage to every principal but EventBridge (whose own statements then deny every rule)"
  }
}

# The router's role: each action the router calls, on the resource it calls it on, nothing more.
run "router_permissions" {
  command = plan

  # Exactly the actions the code under router/ and cmd/ calls (SendMessage also authorises
  # SendMessageBatch, DeleteMessage DeleteMessageBatch).
  assert {
    condition = toset(flatten([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s.Action])) == toset([
      "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes", "sqs:SendMessage",
      "ec2:DescribeImages", "ec2:DescribeCapacityReservations", "ec2:DescribeInstanceStatus",
      "cloudwatch:PutMetricData", "events:ListRuleNamesByTarget", "events:DescribeRule",
    ])
    error_message = "the router's role must grant the actions the router calls and no other (no ec2:DescribeInstances, events:ListRules, events:ListTargetsByRule, sqs:GetQueueUrl)"
  }
  # One statement per queue.
  assert {
    condition = [for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : {
      resource = s.Resource, actions = toset(flatten([s.Action]))
      } if s.Sid == "IntakeQueue"] == [{
      resource = "arn:aws:sqs:eu-west-1:111122223333:hr-prod-eu"
      actions  = toset(["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"])
    }]
    error_message = "statement IntakeQueue: receive, delete, change visibility and read attributes, on the intake queue alone"
  }
  assert {
    condition = [for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : {
      resource = s.Resource, actions = toset(flatten([s.Action]))
      } if s.Sid == "DeadLetter"] == [{
      resource = "arn:aws:sqs:eu-west-1:111122223333:hr-prod-eu-dlq"
      actions  = toset(["sqs:SendMessage", "sqs:GetQueueAttributes"])
    }]
    error_message = "statement DeadLetter: send and read attributes, on the DLQ alone"
  }
  # The router may not receive, delete or purge dead letters: it could erase an injection's trace.
  assert {
    condition = alltrue([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement :
      length(setintersection(toset(flatten([s.Action])), ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:PurgeQueue", "sqs:*", "*"])) == 0
      if length(setintersection(toset(flatten([s.Resource])), ["arn:aws:sqs:eu-west-1:111122223333:hr-prod-eu-dlq", "*"])) > 0
    ])
    error_message = "no statement may let the router receive, delete or purge messages of the DLQ"
  }
  # What cannot be scoped to a resource is scoped to the module's region.
  assert {
    condition = alltrue([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement :
      try(s.Condition.StringEquals["aws:RequestedRegion"], "") == "eu-west-1"
      if contains(flatten([s.Resource]), "*")
    ])
    error_message = "every statement on Resource \"*\" must be conditioned on aws:RequestedRegion = the module's region"
  }
  assert {
    condition     = toset([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : s.Sid]) == toset(["IntakeQueue", "DeadLetter", "PreDrainChecks", "InstanceStatusPoller", "Metrics", "InspectRules"])
    error_message = "the default statements are IntakeQueue, DeadLetter, PreDrainChecks, InstanceStatusPoller, Metrics, InspectRules"
  }
}

run "router_permissions_forward_and_key" {
  command = plan

  variables {
    kms_key_arn         = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    karpenter_queue_arn = "arn:aws:sqs:eu-west-1:111122223333:Karpenter-prod-eu"
  }

  # doctor reads the attributes of Karpenter's queue with the router's credentials.
  assert {
    condition = [for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : {
      resource = s.Resource, actions = toset(flatten([s.Action]))
      } if s.Sid == "ForwardToKarpenter"] == [{
      resource = "arn:aws:sqs:eu-west-1:111122223333:Karpenter-prod-eu"
      actions  = toset(["sqs:SendMessage", "sqs:GetQueueAttributes"])
    }]
    error_message = "statement ForwardToKarpenter: send and read attributes, on Karpenter's queue alone"
  }
  # The key is only used through SQS.
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement : try(s.Condition, null) if s.Sid == "QueueKey"]) == { StringEquals = { "kms:ViaService" = "sqs.eu-west-1.amazonaws.com" } }
    error_message = "statement QueueKey must be conditioned on kms:ViaService = SQS in the module's region"
  }
}

# The router's two EC2 writes: only on this cluster's Karpenter instances in this region and
# account, as Karpenter's own AllowScopedDeletion.
run "router_ec2_writes" {
  command = plan

  variables {
    enable_reschedule      = true
    enable_reboot_in_place = true
  }

  assert {
    condition = { for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement :
      s.Sid => { action = s.Action, resource = s.Resource, condition = try(s.Condition, null) }
      if contains(["RescheduleEvents", "RebootInPlace"], s.Sid)
      } == { for sid, action in { RescheduleEvents = "ec2:ModifyInstanceEventStartTime", RebootInPlace = "ec2:RebootInstances" } :
      sid => {
        action   = action
        resource = "arn:aws:ec2:eu-west-1:111122223333:instance/*"
        condition = {
          StringEquals = { "aws:ResourceTag/kubernetes.io/cluster/prod-eu" = "owned" }
          StringLike   = { "aws:ResourceTag/karpenter.sh/nodepool" = "*" }
        }
      }
    }
    error_message = "ec2:ModifyInstanceEventStartTime and ec2:RebootInstances must be granted on this region's and account's instances owned by the cluster and tagged with a NodePool, and nowhere else"
  }
  assert {
    condition = alltrue([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement :
      !contains(flatten([s.Resource]), "*")
      if length(setintersection(toset(flatten([s.Action])), ["ec2:ModifyInstanceEventStartTime", "ec2:RebootInstances"])) > 0
    ])
    error_message = "no EC2 write on Resource \"*\""
  }
  assert {
    condition = one([for s in jsondecode(aws_iam_role_policy.router[0].policy).Statement :
      { action = s.Action, resource = s.Resource, condition = s.Condition } if s.Sid == "RebootMigration"
    ]) == { action = "ec2:DescribeInstances", resource = "*", condition = { StringEquals = { "aws:RequestedRegion" = "eu-west-1" } } }
    error_message = "reboot in place reads reboot migration with ec2:DescribeInstances (no resource-level scoping), in the module's region only"
  }
}

# Who may assume the router's role: EKS Pod Identity for this cluster's ServiceAccount only.
run "router_trust_pod_identity" {
  command = plan

  variables {
    service_account_namespace = "ops"
    service_account_name      = "hr"
  }

  assert {
    condition = jsondecode(aws_iam_role.router[0].assume_role_policy).Statement == [{
      Sid       = "EKSPodIdentity"
      Effect    = "Allow"
      Principal = { Service = "pods.eks.amazonaws.com" }
      Action    = ["sts:AssumeRole", "sts:TagSession"]
      Condition = {
        StringEquals = {
          "aws:RequestTag/eks-cluster-arn"            = "arn:aws:eks:eu-west-1:111122223333:cluster/prod-eu"
          "aws:RequestTag/kubernetes-namespace"       = "ops"
          "aws:RequestTag/kubernetes-service-account" = "hr"
        }
      }
    }]
    error_message = "the Pod Identity trust must be bound to this cluster, namespace and ServiceAccount through EKS's session tags, with sts:TagSession allowed"
  }
}

run "router_trust_irsa" {
  command = plan

  variables {
    identity_type             = "irsa"
    oidc_provider_arn         = "arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF"
    service_account_namespace = "ops"
    service_account_name      = "hr"
  }

  assert {
    condition = jsondecode(aws_iam_role.router[0].assume_role_policy).Statement == [{
      Sid       = "IRSA"
      Effect    = "Allow"
      Principal = { Federated = "arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF" }
      Action    = "sts:AssumeRoleWithWebIdentity"
      Condition = {
        StringEquals = {
          "oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF:sub" = "system:serviceaccount:ops:hr"
          "oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF:aud" = "sts.amazonaws.com"
        }
      }
    }]
    error_message = "the IRSA trust must be this cluster's OIDC provider, for this namespace and ServiceAccount (exact match) and the STS audience"
  }
}

# Issue 38, 1: in dispatcher mode the rules send to the dispatcher queue, whose policy is the
# intake's: EventBridge for this module's rules and the listed senders, nobody else. Not the
# dispatcher's own role, not an admin: what lands there is sent on under the dispatcher's role.
run "queue_senders_dispatcher_queue" {
  command = plan

  variables {
    dispatcher = {
      enabled     = true
      zip_path    = "tests/fixtures/dispatcher.zip"
      sender_arns = ["arn:aws:iam::111122223333:role/oncall"]
    }
  }

  override_resource {
    target          = aws_sqs_queue.dispatcher
    override_during = plan
    values = {
      arn = "arn:aws:sqs:eu-west-1:111122223333:hr-prod-eu-dispatcher"
      url = "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-prod-eu-dispatcher"
    }
  }

  assert {
    condition = alltrue([for c in [
      { denied = false, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "true" } },
      { denied = false, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/oncall", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/someone-elses", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-dispatcher", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/hr-prod-eu-router", "aws:SecureTransport" = "true" } },
      { denied = true, service = "", ctx = { "aws:PrincipalArn" = "arn:aws:iam::111122223333:role/Admin", "aws:SecureTransport" = "true" } },
      { denied = true, service = "sns.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "sns.amazonaws.com", "aws:SecureTransport" = "true" } },
      { denied = true, service = "events.amazonaws.com", ctx = { "aws:PrincipalServiceName" = "events.amazonaws.com", "aws:SourceArn" = "arn:aws:events:eu-west-1:111122223333:rule/hr-prod-eu-rule", "aws:SecureTransport" = "false" } },
      ] : c.denied == anytrue([for s in jsondecode(aws_sqs_queue_policy.dispatcher[0].policy).Statement :
        s.Effect == "Deny" &&
        length(setintersection(toset(flatten([s.Action])), ["sqs:SendMessage", "sqs:*", "*"])) > 0 &&
        (s.Principal == "*" || try(s.Principal.AWS, "") == "*" || try(s.Principal.Service, "") == c.service) &&
        alltrue([for op, kv in try(s.Condition, {}) : alltrue([for k, v in kv :
          lookup(c.ctx, k, null) == null ? contains(["StringNotEquals", "ArnNotEquals"], op) :
          contains(["StringEquals", "ArnEquals", "Bool"], op) ? contains(flatten([v]), c.ctx[k]) :
          contains(["StringNotEquals", "ArnNotEquals"], op) ? !contains(flatten([v]), c.ctx[k]) :
          tobool("operator ${op} unknown to this test")
        ])])
    ])])
    error_message = "the dispatcher queue must deny sqs:SendMessage to every caller but EventBridge for this module's rules and dispatcher.sender_arns (over TLS)"
  }
  # EventBridge is a service principal: its one Allow, pinned to the module's rules.
  assert {
    condition = [for s in jsondecode(aws_sqs_queue_policy.dispatcher[0].policy).Statement : s.Condition if s.Effect == "Allow"] == [
      { ArnEquals = { "aws:SourceArn" = [for r in aws_cloudwatch_event_rule.this : r.arn] } }
    ]
    error_message = "the dispatcher queue policy's one Allow is EventBridge's, pinned to the module's rules"
  }
  # The role polls its own queue, and only it.
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.dispatcher[0].policy).Statement : s if s.Sid == "DispatcherQueue"]) == { Sid = "DispatcherQueue", Effect = "Allow", Action = ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"], Resource = "arn:aws:sqs:eu-west-1:111122223333:hr-prod-eu-dispatcher" }
    error_message = "the dispatcher's role must receive, delete and read the attributes of the dispatcher queue, and of no other"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.dispatcher[0].policy).Statement : s if contains(flatten([s.Action]), "sqs:ReceiveMessage") || contains(flatten([s.Action]), "sqs:DeleteMessage")]) == 1
    error_message = "no other statement of the dispatcher's role may receive or delete messages"
  }
}

# The runbook's Terraform steps (docs/runbook.md), planned with a mocked AWS provider (no
# credentials, no network): the infrastructure first without the deny on Karpenter's role, the
# takeover attaching it, the handback detaching it again. The moto apply (test/terraform)
# applies the module itself.

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
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::111122223333:role/mocked-role" }
  }
  mock_resource "aws_iam_policy" {
    defaults = { arn = "arn:aws:iam::111122223333:policy/mocked" }
  }
}

variables {
  region                         = "eu-west-1"
  cluster_name                   = "prod-eu"
  karpenter_queue_arn            = "arn:aws:sqs:eu-west-1:111122223333:Karpenter-prod-eu"
  karpenter_controller_role_name = "KarpenterController-prod-eu"
}

run "step_1_infrastructure_without_the_deny" {
  command = plan
  variables {
    takeover = false
  }
  assert {
    condition     = output.karpenter_deny_attached_role == ""
    error_message = "before the takeover Karpenter must keep DescribeInstanceStatus: the deny is not attached"
  }
  assert {
    condition     = startswith(output.queue_url, "https://sqs.") && startswith(output.dead_letter_queue_url, "https://sqs.")
    error_message = "the queues exist from the first apply"
  }
  assert {
    condition     = yamldecode(output.helm_values).settings.shadow == true && output.router_environment.HEALTH_ROUTER_SHADOW == "true"
    error_message = "before the takeover the router runs in shadow"
  }
}

run "step_4_takeover" {
  command = plan
  variables {
    takeover = true
  }
  assert {
    condition     = output.karpenter_deny_attached_role == "KarpenterController-prod-eu"
    error_message = "the takeover attaches the deny to Karpenter's role"
  }
  assert {
    condition     = !can(yamldecode(output.helm_values).settings.shadow) && !contains(keys(output.router_environment), "HEALTH_ROUTER_SHADOW")
    error_message = "after the takeover the router acts"
  }
}

run "rollback_handback" {
  command = plan
  variables {
    takeover = false
  }
  assert {
    condition     = output.karpenter_deny_attached_role == ""
    error_message = "the handback detaches the deny"
  }
}

# Test-only configuration: the module applied to moto_server (see ../e2e_test.go), with every
# endpoint pointed at moto.
#
# Two instances: "health_router" (rules -> intake queue) gets real events through its rules;
# "dispatcher" deploys the dispatcher queue, the Lambda it feeds (an event source mapping) and
# the failure queue, with its rules on a bus of their own and no event put on it: moto would
# hand what reaches the dispatcher queue to the Lambda, and it cannot run a provided.al2023
# function. Package lambda/dispatch tests the Lambda's logic against moto's SQS, EC2 and
# CloudWatch instead.

terraform {
  required_version = ">= 1.9"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 7.0"
    }
  }
}

variable "endpoint" {
  description = "moto_server URL, for example http://127.0.0.1:5000."
  type        = string
}

variable "dispatcher_zip_path" {
  description = "Zip uploaded as the dispatcher's code; moto never runs it, so any zip will do."
  type        = string
}

variable "create_observability" {
  description = "Create the dashboard and alarms (moto serves PutDashboard and PutMetricAlarm)."
  type        = bool
  default     = true
}

provider "aws" {
  region                      = "us-east-1"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true

  endpoints {
    sqs        = var.endpoint
    events     = var.endpoint
    iam        = var.endpoint
    sts        = var.endpoint
    cloudwatch = var.endpoint
    lambda     = var.endpoint
    eks        = var.endpoint
    logs       = var.endpoint
  }
}

module "health_router" {
  source = "../../../terraform"

  cluster_name     = "moto-e2e"
  create_dashboard = var.create_observability
  create_alarms    = var.create_observability

  karpenter_queue_arn          = "arn:aws:sqs:us-east-1:123456789012:Karpenter-moto-e2e"
  create_karpenter_deny_policy = true

  # Every statement, so that the applied policy can be read back (e2e_test.go: iam policies).
  enable_event_windows   = true
  enable_reschedule      = true
  enable_reboot_in_place = true

  # The other instance's dispatcher feeds this queue too (its cluster_queues).
  extra_sender_arns = [module.dispatcher.dispatcher_role_arn]

  tags = { "health-router/test" = "moto-e2e" }
}

resource "aws_cloudwatch_event_bus" "dispatcher" {
  name = "health-router-moto-dispatcher"
}

module "dispatcher" {
  source = "../../../terraform"

  cluster_name     = "moto-disp"
  event_bus_name   = aws_cloudwatch_event_bus.dispatcher.name
  create_dashboard = false
  create_alarms    = var.create_observability

  identity_type     = "irsa"
  oidc_provider_arn = "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF"

  dispatcher = {
    enabled  = true
    zip_path = var.dispatcher_zip_path
    cluster_queues = {
      "moto-e2e" = { url = module.health_router.queue_url, arn = module.health_router.queue_arn }
    }
    # Another cluster's queue key: the dispatcher's QueueKeys statement, read back by the test.
    kms_key_arns = ["arn:aws:kms:us-east-1:123456789012:key/00000000-0000-4000-8000-000000000000"]
  }
}

output "queue_url" {
  value = module.health_router.queue_url
}

output "helm_values" {
  value = module.health_router.helm_values
}

output "dispatcher_helm_values" {
  value = module.dispatcher.helm_values
}

output "dead_letter_queue_url" {
  value = module.health_router.dead_letter_queue_url
}

output "rule_names" {
  value = module.health_router.rule_names
}

output "iam_role_name" {
  value = module.health_router.iam_role_name
}

output "dashboard_name" {
  value = module.health_router.dashboard_name
}

output "alarm_names" {
  value = module.health_router.alarm_names
}

output "dispatcher_function_arn" {
  value = module.dispatcher.dispatcher_function_arn
}

output "dispatcher_queue_url" {
  value = module.dispatcher.dispatcher_queue_url
}

output "dispatcher_failure_queue_url" {
  value = module.dispatcher.dispatcher_failure_queue_url
}

output "dispatcher_alarm_names" {
  value = module.dispatcher.alarm_names
}

# Test-only configuration: the module applied to moto_server (see ../e2e_test.go), with every
# endpoint pointed at moto. The dispatcher Lambda is off here: moto would need Docker to run
# it, so package lambda/dispatch tests it against moto's SQS, EC2 and CloudWatch instead.

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
  }
}

module "health_router" {
  source = "../../../terraform"

  cluster_name     = "moto-e2e"
  create_dashboard = var.create_observability
  create_alarms    = var.create_observability

  karpenter_interruption_queue_arn = "arn:aws:sqs:us-east-1:123456789012:Karpenter-moto-e2e"
  create_karpenter_deny_policy     = true

  tags = { "health-router/test" = "moto-e2e" }
}

output "queue_url" {
  value = module.health_router.queue_url
}

output "dlq_url" {
  value = module.health_router.dlq_url
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

variable "region" {
  description = "AWS region of the cluster."
  type        = string
}

variable "cluster_name" {
  description = "Name of the EKS cluster."
  type        = string
}

variable "karpenter_queue_arn" {
  description = "ARN of Karpenter's interruption queue (Karpenter's settings.interruptionQueue): the router forwards the drains it decides to it."
  type        = string
}

variable "karpenter_controller_role_name" {
  description = "Name of Karpenter's controller IAM role: the DescribeInstanceStatus deny is attached to it when takeover is true."
  type        = string
}

variable "takeover" {
  description = "Whether the router has taken over from Karpenter's own handling: true attaches the DescribeInstanceStatus deny to Karpenter's role (docs/runbook.md, step 4: after the router ran in shadow and health-router doctor passed); false gives it back (the rollback). No default: choose."
  type        = bool
}

variable "alarm_sns_topic_arn" {
  description = "SNS topic for the alarms; null for none."
  type        = string
  default     = null
}

variable "region" {
  description = "AWS region of the cluster."
  type        = string
}

variable "cluster_name" {
  description = "Name of the EKS cluster."
  type        = string
}

variable "karpenter_interruption_queue_arn" {
  description = "ARN of Karpenter's interruption queue (settings.interruptionQueue), for forward mode; null to leave it out."
  type        = string
  default     = null
}

variable "karpenter_controller_role_name" {
  description = "Name of Karpenter's controller IAM role, to attach the DescribeInstanceStatus deny to; null to attach it yourself."
  type        = string
  default     = null
}

variable "alarm_sns_topic_arn" {
  description = "SNS topic for the alarms; null for none."
  type        = string
  default     = null
}

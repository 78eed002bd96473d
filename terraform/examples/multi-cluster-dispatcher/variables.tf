variable "region" {
  description = "AWS region of both clusters."
  type        = string
}

variable "dispatcher_zip_path" {
  description = "Zip built by lambda/build.sh."
  type        = string
  default     = "../../../dist/dispatcher.zip"
}

variable "batch_oidc_provider_arn" {
  description = "IAM OIDC provider ARN of the batch-eu cluster (IRSA)."
  type        = string
}

variable "alarm_sns_topic_arn" {
  description = "SNS topic for the alarms; null for none."
  type        = string
  default     = null
}

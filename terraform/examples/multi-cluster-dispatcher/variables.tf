variable "region" {
  description = "AWS region of both clusters."
  type        = string
  default     = "eu-west-1"
}

variable "dispatcher_zip_path" {
  description = "Zip built by lambda/build.sh."
  type        = string
  default     = "../../../dist/dispatcher.zip"
}

variable "batch_oidc_provider_arn" {
  description = "IAM OIDC provider ARN of the batch-eu cluster (IRSA)."
  type        = string
  default     = "arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/0123456789ABCDEF0123456789ABCDEF"
}

variable "alarm_sns_topic_arn" {
  description = "SNS topic for the alarms; null for none."
  type        = string
  default     = null
}

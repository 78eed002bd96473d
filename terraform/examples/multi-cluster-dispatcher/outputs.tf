output "queue_urls" {
  description = "Each router's --queue-url."
  value = {
    "prod-eu"  = module.prod.queue_url
    "batch-eu" = module.batch.queue_url
  }
}

output "iam_role_arns" {
  description = "Each router's role: batch-eu's for its service account annotation (IRSA), prod-eu's already associated (Pod Identity)."
  value = {
    "prod-eu"  = module.prod.iam_role_arn
    "batch-eu" = module.batch.iam_role_arn
  }
}

output "dispatcher_function_arn" {
  description = "The dispatcher Lambda."
  value       = module.prod.dispatcher_function_arn
}

output "dispatcher_queue_url" {
  description = "The queue the rules send to, which feeds the dispatcher Lambda."
  value       = module.prod.dispatcher_queue_url
}

output "dispatcher_failure_queue_url" {
  description = "Events the dispatcher could not route after retries."
  value       = module.prod.dispatcher_failure_queue_url
}

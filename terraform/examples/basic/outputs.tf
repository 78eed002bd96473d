output "queue_url" {
  description = "The router's --queue-url."
  value       = module.health_router.queue_url
}

output "dlq_url" {
  description = "The router's dead-letter queue."
  value       = module.health_router.dlq_url
}

output "iam_role_arn" {
  description = "The router's role (already associated with the service account through EKS Pod Identity)."
  value       = module.health_router.iam_role_arn
}

output "helm_values" {
  description = "Values to give the router's chart."
  value = {
    queueURL     = module.health_router.queue_url
    dlqURL       = module.health_router.dlq_url
    clusterName  = module.health_router.cluster_name
    forwardQueue = var.karpenter_interruption_queue_arn
  }
}

output "dashboard_name" {
  description = "CloudWatch dashboard."
  value       = module.health_router.dashboard_name
}

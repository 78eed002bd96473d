output "queue_url" {
  description = "The router's --queue-url."
  value       = module.health_router.queue_url
}

output "dead_letter_queue_url" {
  description = "The router's --dead-letter-queue-url."
  value       = module.health_router.dead_letter_queue_url
}

output "karpenter_queue_url" {
  description = "Karpenter's interruption queue as a URL: health-router handback --karpenter-queue-url (docs/runbook.md, the rollback)."
  value       = module.health_router.karpenter_queue_url
}

output "iam_role_arn" {
  description = "The router's role (already associated with the service account through EKS Pod Identity)."
  value       = module.health_router.iam_role_arn
}

output "helm_values" {
  description = "The Helm chart's values (YAML): terraform output -raw helm_values > values.yaml; helm install health-router deploy/charts/health-router -n health-router --create-namespace -f values.yaml."
  value       = module.health_router.helm_values
}

output "router_environment" {
  description = "The router's HEALTH_ROUTER_* environment, for its ConfigMap or Helm values."
  value       = module.health_router.router_environment
}

output "dashboard_name" {
  description = "CloudWatch dashboard."
  value       = module.health_router.dashboard_name
}

output "karpenter_deny_attached_role" {
  # Never null: Terraform keeps no null output in its state, so `terraform output` of a null
  # one fails ("Output not found") instead of saying that nothing is attached.
  description = "Karpenter's role the DescribeInstanceStatus deny is attached to; \"\" before the takeover and after a handback."
  value       = module.health_router.karpenter_deny_attached_role == null ? "" : module.health_router.karpenter_deny_attached_role
}

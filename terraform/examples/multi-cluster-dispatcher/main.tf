# Two EKS clusters in one account and region. AWS service events arrive once per region, so one
# set of rules (in the "prod" module instance) sends to the dispatcher queue, which feeds the
# dispatcher Lambda (an event source mapping; nothing may invoke the Lambda directly), which
# sends each event to the intake queue of the cluster that owns the instances (from the instances' tags),
# splits Health events that span both clusters, and sends AMI events to both. The "batch"
# instance creates its queue, role and alarms but no rules.
#
# Build the zip first: lambda/build.sh dist/dispatcher.zip

provider "aws" {
  region = var.region
}

module "batch" {
  source = "../.."

  cluster_name = "batch-eu"

  # This cluster's events come from the dispatcher, not from rules of its own.
  rules = {
    scheduled_change                  = false
    spot_interruption                 = false
    rebalance_recommendation          = false
    state_change                      = false
    capacity_reservation_interruption = false
    ami_state_change                  = false
    capacity_block_expiration         = false
  }

  # Only the dispatcher sends to this cluster's intake queue: its queue policy denies every
  # other principal of the account.
  extra_sender_arns = [module.prod.dispatcher_role_arn]

  # IRSA here, to show the other identity type.
  identity_type     = "irsa"
  oidc_provider_arn = var.batch_oidc_provider_arn

  alarm_sns_topic_arn = var.alarm_sns_topic_arn
}

module "prod" {
  source = "../.."

  cluster_name                    = "prod-eu"
  create_pod_identity_association = true

  dispatcher = {
    enabled  = true
    zip_path = var.dispatcher_zip_path
    cluster_queues = {
      "batch-eu" = { url = module.batch.queue_url, arn = module.batch.queue_arn }
    }
  }

  alarm_sns_topic_arn = var.alarm_sns_topic_arn
}

# Variable validations reject bad input.

mock_provider "aws" {
  override_during = plan

  mock_resource "aws_sqs_queue" {
    defaults = { arn = "arn:aws:sqs:eu-west-1:111122223333:mocked-queue" }
  }
}

variables {
  cluster_name = "prod-eu"
}

run "bad_cluster_name" {
  command = plan
  variables { cluster_name = "-not a cluster" }
  expect_failures = [var.cluster_name]
}

run "name_too_long" {
  command = plan
  variables { cluster_name = "a-cluster-name-that-is-far-too-long" }
  expect_failures = [var.name]
}

run "retention_over_sqs_max" {
  command = plan
  variables { message_retention_seconds = 1209601 }
  expect_failures = [var.message_retention_seconds]
}

run "irsa_without_oidc_provider" {
  command = plan
  variables { identity_type = "irsa" }
  expect_failures = [var.oidc_provider_arn]
}

run "unknown_identity_type" {
  command = plan
  variables { identity_type = "kiam" }
  expect_failures = [var.identity_type]
}

run "kms_alias_instead_of_arn" {
  command = plan
  variables { kms_key_arn = "alias/health-router" }
  expect_failures = [var.kms_key_arn]
}

run "karpenter_queue_not_an_sqs_arn" {
  command = plan
  variables { karpenter_queue_arn = "https://sqs.eu-west-1.amazonaws.com/111122223333/Karpenter" }
  expect_failures = [var.karpenter_queue_arn]
}

run "dispatcher_without_zip" {
  command = plan
  variables { dispatcher = { enabled = true } }
  expect_failures = [var.dispatcher]
}

run "dispatcher_lists_own_cluster" {
  command = plan
  variables {
    dispatcher = {
      enabled        = true
      zip_path       = "tests/fixtures/dispatcher.zip"
      cluster_queues = { "prod-eu" = { url = "https://sqs.eu-west-1.amazonaws.com/111122223333/x", arn = "arn:aws:sqs:eu-west-1:111122223333:x" } }
    }
  }
  expect_failures = [var.dispatcher]
}

run "pod_identity_association_with_irsa" {
  command = plan
  variables {
    identity_type                   = "irsa"
    oidc_provider_arn               = "arn:aws:iam::111122223333:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/ABC"
    create_pod_identity_association = true
  }
  expect_failures = [var.create_pod_identity_association]
}

run "sender_is_a_session_not_a_role" {
  command = plan
  variables { extra_sender_arns = ["arn:aws:sts::111122223333:assumed-role/oncall/alice"] }
  expect_failures = [var.extra_sender_arns]
}

run "dead_letter_sender_is_not_an_iam_arn" {
  command = plan
  variables { extra_dead_letter_sender_arns = ["hr-prod-eu-router"] }
  expect_failures = [var.extra_dead_letter_sender_arns]
}

run "good_input_plans" {
  command = plan
  variables {
    name                      = "hr-ok"
    message_retention_seconds = 345600
    max_receive_count         = 50
  }
  assert {
    condition     = aws_sqs_queue.intake.message_retention_seconds == 345600 && jsondecode(aws_sqs_queue.intake.redrive_policy).maxReceiveCount == 50
    error_message = "valid input must be applied as given"
  }
}

run "dispatcher_batch_size_over_ten" {
  command = plan
  variables {
    dispatcher = { enabled = true, zip_path = "tests/fixtures/dispatcher.zip", batch_size = 11 }
  }
  expect_failures = [var.dispatcher]
}

run "dispatcher_sender_not_a_principal" {
  command = plan
  variables {
    dispatcher = { enabled = true, zip_path = "tests/fixtures/dispatcher.zip", sender_arns = ["arn:aws:sts::111122223333:assumed-role/oncall/me"] }
  }
  expect_failures = [var.dispatcher]
}

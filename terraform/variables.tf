################################################################################
# General
################################################################################

variable "cluster_name" {
  description = "Name of the EKS cluster the router runs in. Used as the ClusterName dimension of the router's CloudWatch metrics, in resource names, for the EKS Pod Identity association and the role's trust (eks-cluster-arn), and in the tag that scopes the router's EC2 writes (kubernetes.io/cluster/<cluster_name> = owned)."
  type        = string

  validation {
    condition     = can(regex("^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$", var.cluster_name))
    error_message = "cluster_name must be a valid EKS cluster name: 1-100 characters, letters, digits, hyphens and underscores, starting with a letter or digit."
  }
}

variable "name" {
  description = "Prefix of every resource name (queues, rules, roles, alarms, dashboard). Defaults to \"hr-<cluster_name>\". At most 30 characters, so that rule names stay within EventBridge's 64-character limit."
  type        = string
  default     = null

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,30}$", coalesce(var.name, "hr-${var.cluster_name}")))
    error_message = "The resource name prefix (var.name, or \"hr-<cluster_name>\" when unset) must be 1-30 characters of letters, digits, hyphens and underscores; set var.name to a shorter prefix."
  }
}

variable "tags" {
  description = "Tags added to every resource that supports them."
  type        = map(string)
  default     = {}
}

################################################################################
# Intake queue
################################################################################

variable "message_retention_seconds" {
  description = "How long the intake queue keeps a message. A message is deleted as soon as its outcome is recorded (deferrals are held on NodeClaims, not in the queue), so this bounds how long an event can wait for a retry through an outage. Defaults to the SQS maximum, 14 days."
  type        = number
  default     = 1209600

  validation {
    condition     = var.message_retention_seconds >= 60 && var.message_retention_seconds <= 1209600 && floor(var.message_retention_seconds) == var.message_retention_seconds
    error_message = "message_retention_seconds must be a whole number between 60 and 1209600 (14 days, the SQS maximum)."
  }
}

variable "visibility_timeout_seconds" {
  description = "Default visibility timeout of the intake queue. The router extends it per message with ChangeMessageVisibility while it works and to defer; this value only matters when the router dies holding a message."
  type        = number
  default     = 60

  validation {
    condition     = var.visibility_timeout_seconds >= 0 && var.visibility_timeout_seconds <= 43200
    error_message = "visibility_timeout_seconds must be between 0 and 43200 (12 hours)."
  }
}

variable "receive_wait_time_seconds" {
  description = "Default long-polling wait of the intake queue, in seconds."
  type        = number
  default     = 20

  validation {
    condition     = var.receive_wait_time_seconds >= 0 && var.receive_wait_time_seconds <= 20
    error_message = "receive_wait_time_seconds must be between 0 and 20."
  }
}

variable "max_receive_count" {
  description = "Receives after which SQS moves an intake message to the dead-letter queue. A message is received again only when it is retried (an outage; backoff up to 5 minutes), and the router dead-letters poison messages itself, so this is the backstop for a router that crashes on a message; keep it high enough to ride out an outage (100 retries is several hours)."
  type        = number
  default     = 100

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000 && floor(var.max_receive_count) == var.max_receive_count
    error_message = "max_receive_count must be a whole number between 1 and 1000."
  }
}

variable "kms_key_arn" {
  description = "ARN of a customer-managed KMS key for queue encryption. When null (the default) the queues use SQS-managed encryption (SSE-SQS). With a key, its key policy must let events.amazonaws.com (and the dispatcher role, if any) use kms:GenerateDataKey and kms:Decrypt."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/.+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>), not an alias or key ID."
  }
}

variable "kms_data_key_reuse_period_seconds" {
  description = "How long SQS reuses a data key before calling KMS again, when kms_key_arn is set."
  type        = number
  default     = 300

  validation {
    condition     = var.kms_data_key_reuse_period_seconds >= 60 && var.kms_data_key_reuse_period_seconds <= 86400
    error_message = "kms_data_key_reuse_period_seconds must be between 60 and 86400."
  }
}

################################################################################
# EventBridge rules
################################################################################

variable "rules" {
  description = "Which EventBridge rules to create, one per event kind (names as the router's kinds). Turn all off in a cluster whose queue is fed by another module instance's dispatcher Lambda."
  type = object({
    scheduled_change                  = optional(bool, true) # AWS Health, service EC2, category scheduledChange
    spot_interruption                 = optional(bool, true) # EC2 Spot Instance Interruption Warning
    rebalance_recommendation          = optional(bool, true) # EC2 Instance Rebalance Recommendation
    state_change                      = optional(bool, true) # EC2 Instance State-change Notification
    capacity_reservation_interruption = optional(bool, true) # EC2 Capacity Reservation Instance Interruption Warning
    ami_state_change                  = optional(bool, true) # EC2 AMI State Change
    capacity_block_expiration         = optional(bool, true) # Capacity Block Expiration Warning
  })
  default  = {}
  nullable = false
}

variable "event_bus_name" {
  description = "Event bus the rules are created on. AWS service events arrive on the default bus."
  type        = string
  default     = "default"
}

variable "extra_source_rule_arns" {
  description = "ARNs of EventBridge rules outside this module that may also send to the intake queue (for example Karpenter's own rules re-pointed at it). Every other rule is denied."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for a in var.extra_source_rule_arns : can(regex("^arn:aws[a-z-]*:events:[a-z0-9-]+:[0-9]{12}:rule/.+$", a))])
    error_message = "Every extra_source_rule_arns entry must be an EventBridge rule ARN."
  }
}

variable "extra_sender_arns" {
  description = "ARNs of IAM roles or users, besides the dispatcher's role in dispatcher mode, that may send to the intake queue: another module instance's dispatcher role (its dispatcher_role_arn output) when that instance feeds this cluster, or a role that moves dead letters back (StartMessageMoveTask sends with the caller's identity). Every other principal of the account is denied sqs:SendMessage by the queue policy, whatever its identity policy allows: a message there is an order to drain a node."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for a in var.extra_sender_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/.+$", a))])
    error_message = "Every extra_sender_arns entry must be an IAM role or user ARN (arn:aws:iam::<account>:role/<name>); for a role, its ARN, not an assumed-role session's."
  }
}

variable "extra_dead_letter_sender_arns" {
  description = "ARNs of IAM roles or users, besides the router's role this module creates, that may send to the dead-letter queue: the router's role when create_iam_role is false. Every other principal of the account is denied sqs:SendMessage there."
  type        = list(string)
  default     = []
  nullable    = false

  validation {
    condition     = alltrue([for a in var.extra_dead_letter_sender_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/.+$", a))])
    error_message = "Every extra_dead_letter_sender_arns entry must be an IAM role or user ARN (arn:aws:iam::<account>:role/<name>); for a role, its ARN, not an assumed-role session's."
  }
}

################################################################################
# Router IAM role
################################################################################

variable "create_iam_role" {
  description = "Create the router's IAM role."
  type        = bool
  default     = true
}

variable "iam_role_name" {
  description = "Name of the router's IAM role. Defaults to \"<name>-router\"."
  type        = string
  default     = null
}

variable "iam_role_permissions_boundary" {
  description = "ARN of a permissions boundary for the IAM roles this module creates."
  type        = string
  default     = null
}

variable "identity_type" {
  description = "How the router's pod gets its role: \"pod_identity\" (EKS Pod Identity, the default) or \"irsa\" (IAM roles for service accounts, needs oidc_provider_arn)."
  type        = string
  default     = "pod_identity"

  validation {
    condition     = contains(["pod_identity", "irsa"], var.identity_type)
    error_message = "identity_type must be \"pod_identity\" or \"irsa\"."
  }
}

variable "oidc_provider_arn" {
  description = "ARN of the cluster's IAM OIDC provider, for identity_type = \"irsa\"."
  type        = string
  default     = null

  validation {
    condition     = var.identity_type != "irsa" || can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/.+$", var.oidc_provider_arn))
    error_message = "identity_type = \"irsa\" needs oidc_provider_arn set to the cluster's IAM OIDC provider ARN (arn:aws:iam::<account>:oidc-provider/oidc.eks.<region>.amazonaws.com/id/<id>)."
  }
}

variable "service_account_namespace" {
  description = "Namespace of the router's Kubernetes service account; the role trusts no other."
  type        = string
  default     = "health-router"
}

variable "service_account_name" {
  description = "Name of the router's Kubernetes service account; the role trusts no other."
  type        = string
  default     = "health-router"
}

variable "create_pod_identity_association" {
  description = "Create the EKS Pod Identity association between the router's service account and its role (identity_type = \"pod_identity\" only). Needs the EKS Pod Identity Agent add-on in the cluster."
  type        = bool
  default     = false

  validation {
    condition     = !var.create_pod_identity_association || var.identity_type == "pod_identity"
    error_message = "create_pod_identity_association needs identity_type = \"pod_identity\"."
  }
}

variable "karpenter_queue_arn" {
  description = "ARN of Karpenter's interruption queue, for the router's forward mode (the router sends the events it decides to act on to Karpenter). Null: no forward permission."
  type        = string
  default     = null

  validation {
    condition     = var.karpenter_queue_arn == null || can(regex("^arn:aws[a-z-]*:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]+(\\.fifo)?$", var.karpenter_queue_arn))
    error_message = "karpenter_queue_arn must be an SQS queue ARN."
  }
}

variable "enable_reschedule" {
  description = "Grant the router ec2:ModifyInstanceEventStartTime, for NodePools annotated healthrouter.io/reschedule=true: the router then moves a scheduled event that has a deadline into the pool's maintenance window. Off by default. Granted on this cluster's Karpenter instances only (tags kubernetes.io/cluster/<cluster_name> = owned and karpenter.sh/nodepool), in the module's region. Run doctor with --reschedule to check the grant."
  type        = bool
  default     = false
}

variable "enable_event_windows" {
  description = "Grant the router the EC2 event-window calls, for NodePools annotated healthrouter.io/event-window=true (the router's --event-windows, with --cluster-name = cluster_name): the router keeps one EC2 event window per such pool, so that AWS schedules new stop, reboot and retirement events of its instances inside the pool's maintenance window. Off by default. CreateInstanceEventWindow only with the tags healthrouter.io/cluster = cluster_name and healthrouter.io/nodepool and no other, Modify/Associate/Disassociate/DeleteInstanceEventWindow only on windows with both, DescribeInstanceEventWindows in the module's region, and CreateTags of healthrouter.io/event-window = <cluster_name>/<pool> alone on this cluster's Karpenter instances. What a window is associated with no IAM condition can scope; the router takes any target it did not associate off its windows. Run doctor with --event-windows to check the grant."
  type        = bool
  default     = false
}

variable "enable_reboot_in_place" {
  description = "Grant the router ec2:RebootInstances, for NodePools whose instance-reboot events are rebooted in place (healthrouter.io/action.scheduled-change.instance-reboot=reboot-in-place, with the router's --reboot-in-place): the router reboots the instance itself once its pods are evicted. Off by default. Granted on this cluster's Karpenter instances only (tags kubernetes.io/cluster/<cluster_name> = owned and karpenter.sh/nodepool), in the module's region. Also grants ec2:DescribeInstances (read-only, no resource-level scoping), with which a system-reboot run reads the instance's reboot migration and, where it is on, reboots the instance itself too."
  type        = bool
  default     = false
}

################################################################################
# Karpenter side
################################################################################

variable "shadow" {
  description = "Adopt the router in shadow beside Karpenter's own handling (docs/runbook.md): the rules still feed the intake queue (EventBridge delivers each event to Karpenter's rules and to these alike), the router decides every event and records what it would have done, and carries nothing out (helm_values and router_environment set it to shadow); the DescribeInstanceStatus deny is not attached to Karpenter's role, whatever karpenter_controller_role_name says. Set false at the takeover."
  type        = bool
  default     = false
}

variable "create_karpenter_deny_policy" {
  description = "Create an IAM policy that denies ec2:DescribeInstanceStatus, to attach to Karpenter's controller role. Karpenter v1.12+ polls DescribeInstanceStatus every minute and drains instances with scheduled events itself, whatever the router decides; without the permission it logs one error and stops polling."
  type        = bool
  default     = false
}

variable "karpenter_controller_role_name" {
  description = "Name of Karpenter's controller IAM role. When set (and create_karpenter_deny_policy is true), the deny policy is attached to it; the router's role may then simulate its policies (iam:SimulatePrincipalPolicy, for doctor's takeover check), and helm_values carries its ARN (settings.karpenterRoleARN)."
  type        = string
  default     = null
}

################################################################################
# Observability
################################################################################

variable "create_dashboard" {
  description = "Create the CloudWatch dashboard."
  type        = bool
  default     = true
}

variable "create_alarms" {
  description = "Create the CloudWatch alarms (dead letters present, intake backlog, router silent, and dispatcher failures when the dispatcher is on)."
  type        = bool
  default     = true
}

variable "alarm_sns_topic_arn" {
  description = "SNS topic ARN notified when an alarm fires and when it clears. Null: alarms without actions."
  type        = string
  default     = null

  validation {
    condition     = var.alarm_sns_topic_arn == null || can(regex("^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:.+$", var.alarm_sns_topic_arn))
    error_message = "alarm_sns_topic_arn must be an SNS topic ARN."
  }
}

variable "backlog_alarm_threshold" {
  description = "Visible intake messages that, when present for backlog_alarm_evaluation_periods consecutive 5-minute periods, fire the backlog alarm. Deferred events are held on NodeClaims, not in the queue, and never count."
  type        = number
  default     = 50

  validation {
    condition     = var.backlog_alarm_threshold >= 1
    error_message = "backlog_alarm_threshold must be at least 1."
  }
}

variable "backlog_alarm_evaluation_periods" {
  description = "Consecutive 5-minute periods the intake backlog must stay above the threshold before the alarm fires."
  type        = number
  default     = 3

  validation {
    condition     = var.backlog_alarm_evaluation_periods >= 1 && var.backlog_alarm_evaluation_periods <= 288
    error_message = "backlog_alarm_evaluation_periods must be between 1 and 288."
  }
}

variable "heartbeat_alarm_period_seconds" {
  description = "Window of the router-silent alarm: it fires when the router published no Heartbeat in this many seconds. Must be a multiple of 60 and cover several of the router's publish intervals."
  type        = number
  default     = 900

  validation {
    condition     = var.heartbeat_alarm_period_seconds >= 300 && var.heartbeat_alarm_period_seconds % 60 == 0
    error_message = "heartbeat_alarm_period_seconds must be a multiple of 60, at least 300."
  }
}

################################################################################
# Dispatcher Lambda (several clusters in one account and region)
################################################################################

variable "dispatcher" {
  description = <<-EOT
    The dispatcher Lambda, for accounts with several clusters: this module instance's rules feed the
    Lambda (through the dispatcher queue), which finds each instance's cluster from its tags and sends
    the event to that cluster's intake queue (this module's queue for cluster_name, plus
    cluster_queues). AMI events go to every cluster. Build the zip with lambda/build.sh.
      enabled                   - deploy the queue and the Lambda and point the rules at the queue
      zip_path                  - path of the zip built by lambda/build.sh (provided.al2023, arm64, handler bootstrap)
      cluster_queues            - other clusters' intake queues: cluster name => { url, arn }
      kms_key_arns              - KMS keys of those queues, if they use customer-managed keys
      memory_size, timeout      - Lambda sizing
      log_retention_days        - retention of the Lambda's log group
      batch_size                - records of the dispatcher queue per invocation (1-10)
      sender_arns               - IAM roles or users, besides EventBridge for this module's rules, that
                                  may send to the dispatcher queue (a role that moves failed events back
                                  with StartMessageMoveTask); every other principal is denied
    The rules send to a queue that feeds the Lambda (an event source mapping), not to the Lambda: no
    principal may invoke it directly. A record it fails is retried up to max_receive_count times, then
    kept in the failure queue.
  EOT
  type = object({
    enabled            = optional(bool, false)
    zip_path           = optional(string)
    cluster_queues     = optional(map(object({ url = string, arn = string })), {})
    kms_key_arns       = optional(list(string), [])
    memory_size        = optional(number, 128)
    timeout            = optional(number, 30)
    log_retention_days = optional(number, 30)
    batch_size         = optional(number, 10)
    sender_arns        = optional(list(string), [])
  })
  default  = {}
  nullable = false

  validation {
    condition     = !var.dispatcher.enabled || var.dispatcher.zip_path != null
    error_message = "dispatcher.enabled needs dispatcher.zip_path (build it with lambda/build.sh)."
  }

  validation {
    condition     = !contains(keys(var.dispatcher.cluster_queues), var.cluster_name)
    error_message = "dispatcher.cluster_queues lists the other clusters; this module's own queue is added for cluster_name."
  }

  validation {
    condition     = var.dispatcher.batch_size >= 1 && var.dispatcher.batch_size <= 10 && floor(var.dispatcher.batch_size) == var.dispatcher.batch_size
    error_message = "dispatcher.batch_size must be a whole number between 1 and 10."
  }

  validation {
    condition     = alltrue([for a in var.dispatcher.sender_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/.+$", a))])
    error_message = "Every dispatcher.sender_arns entry must be an IAM role or user ARN (arn:aws:iam::<account>:role/<name>)."
  }
}

{{/* The chart's name. */}}
{{- define "health-router.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of every object: the release name if it contains the chart's name, else release-chart. */}}
{{- define "health-router.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart label value. */}}
{{- define "health-router.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "health-router.labels" -}}
helm.sh/chart: {{ include "health-router.chart" . }}
{{ include "health-router.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: health-router
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels that select the pods. */}}
{{- define "health-router.selectorLabels" -}}
app.kubernetes.io/name: {{ include "health-router.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Scheduling terms (pod anti-affinity terms, topology spread constraints) with the chart's
selector labels as the labelSelector of every term that has none.
*/}}
{{- define "health-router.withSelector" -}}
{{- $terms := list }}
{{- range .terms }}
{{- $t := deepCopy . }}
{{- if not $t.labelSelector }}
{{- $_ := set $t "labelSelector" (dict "matchLabels" (include "health-router.selectorLabels" $.root | fromYaml)) }}
{{- end }}
{{- $terms = append $terms $t }}
{{- end }}
{{- toYaml $terms }}
{{- end }}

{{/* The ServiceAccount's name. */}}
{{- define "health-router.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "health-router.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: repository@digest (with the tag for people) or repository:tag. */}}
{{- define "health-router.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
The container's HEALTH_ROUTER_* environment, from settings. An empty setting (""/null) is not
rendered: the router's default applies.
*/}}
{{- define "health-router.env" -}}
{{- $s := .Values.settings }}
{{- if and $s.cloudWatchMetrics (not $s.clusterName) }}
{{- fail "settings.clusterName is required with settings.cloudWatchMetrics (the ClusterName dimension of the metrics); the Terraform module's helm_values output sets it" }}
{{- end }}
{{- if and (eq (toString $s.signal) "forward") (not $s.karpenterQueueURL) }}
{{- fail "settings.signal forward needs settings.karpenterQueueURL" }}
{{- end }}
- name: HEALTH_ROUTER_QUEUE_URL
  value: {{ required "settings.queueURL is required: the intake queue (the Terraform module's helm_values output sets it)" $s.queueURL | quote }}
- name: HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL
  value: {{ required "settings.deadLetterQueueURL is required: the dead-letter queue (the Terraform module's helm_values output sets it)" $s.deadLetterQueueURL | quote }}
{{- $strings := list
  (list "HEALTH_ROUTER_KARPENTER_QUEUE_URL" $s.karpenterQueueURL)
  (list "HEALTH_ROUTER_REGION" $s.region)
  (list "HEALTH_ROUTER_CLUSTER_NAME" $s.clusterName)
  (list "HEALTH_ROUTER_ACCOUNT" $s.account)
  (list "HEALTH_ROUTER_SIGNAL" $s.signal)
  (list "HEALTH_ROUTER_KARPENTER_VERSION" $s.karpenterVersion)
  (list "HEALTH_ROUTER_KARPENTER_ROLE_ARN" $s.karpenterRoleARN)
  (list "HEALTH_ROUTER_KARPENTER_NAMESPACE" $s.karpenterNamespace)
  (list "HEALTH_ROUTER_KARPENTER_DEPLOYMENT" (and $s.karpenterNamespace $s.karpenterDeployment))
  (list "HEALTH_ROUTER_CLOUDWATCH_INTERVAL" $s.cloudWatchInterval)
  (list "HEALTH_ROUTER_VISIBILITY_TIMEOUT" $s.visibilityTimeout)
  (list "HEALTH_ROUTER_WAIT_TIME" $s.waitTime)
  (list "HEALTH_ROUTER_HANDLE_TIMEOUT" $s.handleTimeout)
  (list "HEALTH_ROUTER_SHUTDOWN_TIMEOUT" $s.shutdownTimeout)
  (list "HEALTH_ROUTER_LEADER_ELECTION_ID" $s.leaderElectionID)
  (list "HEALTH_ROUTER_FORWARD_CONFIRM_TIMEOUT" $s.forwardConfirmTimeout)
  (list "HEALTH_ROUTER_INSTANCE_STATUS_INTERVAL" $s.instanceStatusInterval)
  (list "HEALTH_ROUTER_ALERTMANAGER_URL" $s.alertmanagerURL)
  (list "HEALTH_ROUTER_UNMANAGED_NODES" $s.unmanagedNodes)
  (list "HEALTH_ROUTER_SHADOW_LEDGER" (printf "%s-shadow" (include "health-router.fullname" $)))
  (list "HEALTH_ROUTER_AWS_ENDPOINT_URL" $s.awsEndpointURL) }}
{{- with $s.senderIDs }}
- name: HEALTH_ROUTER_SENDER_IDS
  value: {{ join "," . | quote }}
{{- end }}
{{- range $strings }}
{{- if index . 1 }}
- name: {{ index . 0 }}
  value: {{ index . 1 | quote }}
{{- end }}
{{- end }}
{{- $bools := list
  (list "HEALTH_ROUTER_CLOUDWATCH_METRICS" $s.cloudWatchMetrics)
  (list "HEALTH_ROUTER_LEADER_ELECT" $s.leaderElect)
  (list "HEALTH_ROUTER_INSTANCE_STATUS_POLLER" $s.instanceStatusPoller)
  (list "HEALTH_ROUTER_NODE_MARKS" $s.nodeMarks)
  (list "HEALTH_ROUTER_REBOOT_IN_PLACE" $s.rebootInPlace)
  (list "HEALTH_ROUTER_EVENT_WINDOWS" $s.eventWindows)
  (list "HEALTH_ROUTER_SHADOW" $s.shadow) }}
{{- range $bools }}
{{- if not (kindIs "invalid" (index . 1)) }}
- name: {{ index . 0 }}
  value: {{ index . 1 | toString | quote }}
{{- end }}
{{- end }}
{{- $ints := list
  (list "HEALTH_ROUTER_WORKERS" $s.workers)
  (list "HEALTH_ROUTER_RECEIVERS" $s.receivers)
  (list "HEALTH_ROUTER_KUBE_CLIENT_BURST" $s.kubeClientBurst)
  (list "HEALTH_ROUTER_INSTANCE_PARALLELISM" $s.instanceParallelism)
  (list "HEALTH_ROUTER_MAX_RECEIVES" $s.maxReceives)
  (list "HEALTH_ROUTER_POD_EVENTS_PER_EVENT" $s.podEventsPerEvent) }}
{{- range $ints }}
{{- if not (kindIs "invalid" (index . 1)) }}
- name: {{ index . 0 }}
  value: {{ index . 1 | int64 | toString | quote }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" $s.kubeClientQPS) }}
- name: HEALTH_ROUTER_KUBE_CLIENT_QPS
  value: {{ $s.kubeClientQPS | toString | quote }}
{{- end }}
{{- if not (kindIs "invalid" $s.instanceEventsPerSecond) }}
- name: HEALTH_ROUTER_INSTANCE_EVENTS_PER_SECOND
  value: {{ $s.instanceEventsPerSecond | toString | quote }}
{{- end }}
{{- with $s.featureGates }}
{{- if not (kindIs "invalid" .reservedCapacity) }}
- name: HEALTH_ROUTER_FEATURE_GATES
  value: {{ printf "ReservedCapacity=%t" .reservedCapacity | quote }}
{{- end }}
{{- end }}
- name: HEALTH_ROUTER_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: HEALTH_ROUTER_METRICS_BIND_ADDRESS
  value: {{ printf ":%d" (int .Values.metrics.port) | quote }}
- name: HEALTH_ROUTER_HEALTH_PROBE_BIND_ADDRESS
  value: {{ printf ":%d" (int .Values.healthProbe.port) | quote }}
{{- if .Values.metrics.secure }}
- name: HEALTH_ROUTER_METRICS_SECURE
  value: "true"
{{- end }}
{{- if .Values.calendar.enabled }}
{{- if has (int .Values.calendar.port) (list (int .Values.metrics.port) (int .Values.healthProbe.port)) }}
{{- fail "calendar.port must differ from metrics.port and healthProbe.port: the calendar has a listener of its own" }}
{{- end }}
- name: HEALTH_ROUTER_CALENDAR_BIND_ADDRESS
  value: {{ printf ":%d" (int .Values.calendar.port) | quote }}
{{- end }}
# The Lease lives next to the pods, where the chart's Role allows it.
- name: HEALTH_ROUTER_LEADER_ELECTION_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- include "health-router.webhookEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The --webhook-* environment. The URL (often a token) and the headers come from Secrets; the
template from the pod's annotation (deployment.yaml sets it).
*/}}
{{- define "health-router.webhookEnv" -}}
{{- with .Values.webhook }}
{{- if and .url .existingSecret }}
{{- fail "webhook.url and webhook.existingSecret are exclusive: set one (existingSecret for a URL that holds a token)" }}
{{- end }}
{{- if and (or .template .headersSecret) (not (or .url .existingSecret)) }}
{{- fail "webhook.template and webhook.headersSecret need webhook.url or webhook.existingSecret" }}
{{- end }}
{{- if .url }}
- name: HEALTH_ROUTER_WEBHOOK_URL
  value: {{ .url | quote }}
{{- else if .existingSecret }}
- name: HEALTH_ROUTER_WEBHOOK_URL
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | quote }}
      key: {{ required "webhook.secretKey is required with webhook.existingSecret" .secretKey | quote }}
{{- end }}
{{- if .template }}
- name: HEALTH_ROUTER_WEBHOOK_TEMPLATE
  valueFrom:
    fieldRef:
      fieldPath: metadata.annotations['healthrouter.io/webhook-template']
{{- end }}
{{- if .headersSecret }}
- name: HEALTH_ROUTER_WEBHOOK_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .headersSecret | quote }}
      key: {{ required "webhook.headersSecretKey is required with webhook.headersSecret" .headersSecretKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Names */}}
{{- define "kco.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kco.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else if hasPrefix .Release.Name $name }}
{{- /* The README's release "kafka-cleaner": kafka-cleaner-operator, not kafka-cleaner-kafka-cleaner-operator */}}
{{- $name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kco.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kco.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kco.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kco.labels" -}}
helm.sh/chart: {{ include "kco.chart" . }}
{{ include "kco.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kafka-cleaner
{{- end }}

{{- define "kco.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kco.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image, by digest when one is given. */}}
{{- define "kco.image" -}}
{{- $repo := printf "%s/%s" .Values.image.registry .Values.image.repository | trimPrefix "/" }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "kco.sidecarImage" -}}
{{- default (include "kco.image" .) .Values.sidecar.image }}
{{- end }}

{{- define "kco.leaseName" -}}
{{- default (include "kco.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{- define "kco.webhookConfigurationName" -}}
{{- default (printf "%s.kafkacleaner.io" (include "kco.fullname" .)) .Values.webhook.configurationName }}
{{- end }}

{{- define "kco.webhookSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "kco.fullname" .)) .Values.webhook.tls.existingSecret }}
{{- end }}

{{/* "key=value,key" for KAFKA_CLEANER_WEBHOOK_OBJECT_SELECTOR */}}
{{- define "kco.webhookObjectSelector" -}}
{{- $parts := list }}
{{- range $key, $value := .Values.webhook.objectSelector }}
{{- if $value }}{{ $parts = append $parts (printf "%s=%s" $key $value) }}{{ else }}{{ $parts = append $parts $key }}{{ end }}
{{- end }}
{{- join "," $parts }}
{{- end }}

{{/* An alert's runbook: its section (the lower-cased alert name is the heading's anchor). */}}
{{- define "kco.runbookUrl" -}}
{{- printf "%s#%s" (trimSuffix "/" .root.Values.metrics.prometheusRule.runbookBaseUrl) (lower .alert) }}
{{- end }}

{{/* The namespaces the operator reconciles, as JSON: watchNamespaces, else the release's
     own; [] (every namespace) only with watchAllNamespaces. */}}
{{- define "kco.watchNamespaces" -}}
{{- if .Values.watchAllNamespaces }}
{{- if .Values.watchNamespaces }}
{{- fail "watchAllNamespaces and watchNamespaces exclude each other" }}
{{- end }}
{{- toJson list }}
{{- else }}
{{- toJson (default (list .Release.Namespace) .Values.watchNamespaces) }}
{{- end }}
{{- end }}

{{/* Namespaces of the broker pods, for the PodMonitor and the NetworkPolicy. */}}
{{- define "kco.brokerNamespaces" -}}
{{- $ns := .explicit }}
{{- if not $ns }}{{ $ns = include "kco.watchNamespaces" .root | fromJsonArray }}{{ end }}
{{- toJson $ns }}
{{- end }}

{{/* The operator's rules in a watched namespace (rbac.yaml explains each). */}}
{{- define "kco.namespacedRules" }}
  - apiGroups: ["kafkacleaner.io"]
    resources: ["compactionpolicies"]
    verbs: ["list", "watch", "patch"]
  - apiGroups: ["kafkacleaner.io"]
    resources: ["compactionpolicies/status"]
    verbs: ["patch"]
  - apiGroups: ["kafkacleaner.io"]
    resources: ["compactionpolicies/finalizers"]
    verbs: ["update"]
  - apiGroups: ["apps"]
    resources: ["statefulsets"]
    verbs: ["get", "list", "patch"]
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["list", "create", "patch", "delete"]
  - apiGroups: ["core.strimzi.io"]
    resources: ["strimzipodsets"]
    verbs: ["get"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "create", "update", "delete"]
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create"]
{{- end }}

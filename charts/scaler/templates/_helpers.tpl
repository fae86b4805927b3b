{{- define "scaler.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "scaler.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "scaler.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "scaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "scaler.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The settings file: chart values, plus what the chart itself decides (Lease, placeholder). */}}
{{- define "scaler.settings" -}}
{{- $kube := dict "lease" (dict "namespace" .Release.Namespace "name" (printf "%s-leader" (include "scaler.fullname" .))) -}}
{{- $kube = merge $kube (dict "placeholder" (dict "namespace" .Release.Namespace "priority_class" .Values.placeholder.priorityClass.name) "clusterapi_namespace" .Values.rbac.clusterApiNamespace) -}}
{{- $s := deepCopy .Values.settings -}}
{{- $_ := set $s "kube" (merge (default dict $s.kube) $kube) -}}
{{- if .Values.externalMetricsApi.tlsSecret -}}
{{- $_ := set $s "metrics_api" (merge (default dict $s.metrics_api) (dict "cert_file" "/etc/scaler/tls/tls.crt" "key_file" "/etc/scaler/tls/tls.key")) -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}

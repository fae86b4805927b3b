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

{{/* How many shards (sharding.shards), checked: an integer from 1 to 1024, as the
service's sharding.shards is. */}}
{{- define "scaler.shards" -}}
{{- $n := dig "shards" 1 (default dict .Values.sharding) -}}
{{- if or (kindIs "string" $n) (not (regexMatch "^[0-9]+$" (toString $n))) (lt (int $n) 1) (gt (int $n) 1024) -}}
{{- fail (printf "sharding.shards: %#v is not a whole number from 1 to 1024" $n) -}}
{{- end -}}
{{- int $n -}}
{{- end -}}

{{/* The selector labels of one shard's pods, for its Deployment and PDB (a dict of root
and shard). With several shards the shard label keeps each Deployment to its own pods;
what serves every model (Service, NetworkPolicy, monitors) selects without it. */}}
{{- define "scaler.shardSelectorLabels" -}}
{{- include "scaler.selectorLabels" .root -}}
{{- if gt (include "scaler.shards" .root | int) 1 }}
scaler.io/shard: {{ .shard | quote }}
{{- end -}}
{{- end -}}

{{- define "scaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "scaler.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces with targets: the Roles are made there and the service watches exactly
these (kube.watch_namespaces). Empty when rbac.clusterWide. JSON list. */}}
{{- define "scaler.watchNamespaces" -}}
{{- if .Values.rbac.clusterWide -}}
{{- if .Values.watchNamespaces }}{{ fail "watchNamespaces and rbac.clusterWide exclude each other: a list of namespaces, or every namespace" }}{{ end -}}
[]
{{- else -}}
{{- default (list .Release.Namespace) .Values.watchNamespaces | uniq | toJson -}}
{{- end -}}
{{- end -}}

{{/* Settings that are secrets: given in `settings`, they go to the chart's Secret (never
the settings ConfigMap); `secrets.env` takes them from an existing Secret. */}}
{{- define "scaler.secretSettings" -}}
["http.push_token", "nats.password", "nats.token", "prometheus.bearer_token", "prometheus.basic_auth_password"]
{{- end -}}
{{/* Also allowed in secrets.env: the user names that go with those passwords. */}}
{{- define "scaler.secretEnvSettings" -}}
{{- concat (include "scaler.secretSettings" . | fromJsonArray) (list "nats.user" "prometheus.basic_auth_user") | toJson -}}
{{- end -}}
{{/* File settings a Secret key can be mounted for (`secrets.files`). */}}
{{- define "scaler.secretFileSettings" -}}
["nats.creds_file", "nats.nkey_seed_file", "nats.tls.ca_file", "nats.tls.cert_file", "nats.tls.key_file"]
{{- end -}}

{{/* SCALER_ variable of a dotted setting: http.push_token -> SCALER_HTTP__PUSH_TOKEN. */}}
{{- define "scaler.envName" -}}
{{- printf "SCALER_%s" (. | upper | replace "." "__") -}}
{{- end -}}

{{/* A dotted setting as a DNS label: nats.tls.ca_file -> nats-tls-ca-file. */}}
{{- define "scaler.settingLabel" -}}
{{- . | replace "." "-" | replace "_" "-" -}}
{{- end -}}

{{/* Secret settings given inline in `settings`: {setting: value}, as JSON. */}}
{{- define "scaler.inlineSecrets" -}}
{{- $out := dict -}}
{{- range $setting := include "scaler.secretSettings" . | fromJsonArray -}}
{{- $parts := splitList "." $setting -}}
{{- $value := get (get $.Values.settings (first $parts) | default dict) (last $parts) -}}
{{- if $value -}}
{{- if hasKey $.Values.secrets.env $setting -}}
{{- fail (printf "settings.%s and secrets.env.%s both set: give one" $setting $setting) -}}
{{- end -}}
{{- $_ := set $out $setting (toString $value) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "scaler.inlineSecretName" -}}
{{- printf "%s-secrets" (include "scaler.fullname" .) -}}
{{- end -}}

{{/* The metrics API's serving certificate Secret; empty in development mode (the service
then signs its own and the APIService skips verification). */}}
{{- define "scaler.metricsApiTlsSecret" -}}
{{- if .Values.settings.metrics_api.enabled -}}
{{- if .Values.externalMetricsApi.tlsSecret -}}
{{- .Values.externalMetricsApi.tlsSecret -}}
{{- else if not .Values.externalMetricsApi.insecureSkipTLSVerify -}}
{{- printf "%s-metrics-api-tls" (include "scaler.fullname" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The names the metrics API certificate must carry: its Service, as the aggregator dials it. */}}
{{- define "scaler.metricsApiDnsNames" -}}
{{- $svc := include "scaler.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson -}}
{{- end -}}

{{/* The settings file: chart values, plus what the chart itself decides (Lease, shards,
placeholder, namespaces, certificate and secret file paths); secret values are taken out. */}}
{{- define "scaler.settings" -}}
{{- $kube := dict "lease" (dict "namespace" .Release.Namespace "name" (printf "%s-leader" (include "scaler.fullname" .))) -}}
{{- $kube = merge $kube (dict "placeholder" (dict "enabled" .Values.placeholder.enabled "namespace" .Release.Namespace "priority_class" .Values.placeholder.priorityClass.name) "clusterapi_namespace" .Values.rbac.clusterApiNamespace "capacitybuffer" (dict "enabled" .Values.capacityBuffer.enabled "namespace" .Release.Namespace)) -}}
{{- $kube = merge $kube (dict "watch_namespaces" (include "scaler.watchNamespaces" . | fromJsonArray) "cluster_wide" .Values.rbac.clusterWide) -}}
{{- $s := deepCopy .Values.settings -}}
{{- range $key, $value := dict "watch_namespaces" "watchNamespaces" "cluster_wide" "rbac.clusterWide" -}}
{{- if hasKey (default dict $s.kube) $key -}}
{{- fail (printf "settings.kube.%s: set %s instead (it decides the RBAC too)" $key $value) -}}
{{- end -}}
{{- end -}}
{{- range $key := list "shards" "shard" -}}
{{- if hasKey (default dict $s.sharding) $key -}}
{{- fail (printf "settings.sharding.%s: set sharding.shards instead (it decides the Deployments, and the chart gives each its shard)" $key) -}}
{{- end -}}
{{- end -}}
{{- $shards := include "scaler.shards" . | int -}}
{{- if gt $shards 1 -}}
{{- $_ := set $s "sharding" (merge (default dict $s.sharding) (dict "shards" $shards)) -}}
{{- end -}}
{{- if hasKey (default dict (default dict $s.kube).placeholder) "enabled" -}}
{{- fail "settings.kube.placeholder.enabled: set placeholder.enabled instead (it decides the RBAC too)" -}}
{{- end -}}
{{- $_ := set $s "kube" (merge (default dict $s.kube) $kube) -}}
{{- range $setting := include "scaler.secretSettings" . | fromJsonArray -}}
{{- $parts := splitList "." $setting -}}
{{- $group := get $s (first $parts) -}}
{{- if kindIs "map" $group -}}
{{- $_ := unset $group (last $parts) -}}
{{- end -}}
{{- end -}}
{{- if include "scaler.metricsApiTlsSecret" . -}}
{{- $_ := set $s "metrics_api" (merge (default dict $s.metrics_api) (dict "cert_file" "/etc/scaler/tls/tls.crt" "key_file" "/etc/scaler/tls/tls.key")) -}}
{{- end -}}
{{- $allowed := include "scaler.secretFileSettings" . | fromJsonArray -}}
{{- range $setting, $ref := .Values.secrets.files -}}
{{- if not (has $setting $allowed) -}}
{{- fail (printf "secrets.files.%s: not a file setting the chart mounts (one of %s)" $setting (join ", " $allowed)) -}}
{{- end -}}
{{- $parts := splitList "." $setting -}}
{{- $node := $s -}}
{{- range $part := initial $parts -}}
{{- if not (kindIs "map" (get $node $part)) -}}
{{- $_ := set $node $part dict -}}
{{- end -}}
{{- $node = get $node $part -}}
{{- end -}}
{{- $_ := set $node (last $parts) (printf "/etc/scaler/secrets/%s/%s" (include "scaler.settingLabel" $setting) $ref.key) -}}
{{- end -}}
{{- toYaml $s -}}
{{- end -}}

{{/* The image reference: registry/repository@digest when image.digest is set, else
registry/repository:tag (the tag defaults to the chart's appVersion). An empty registry
leaves repository as given (a local or kind image). */}}
{{- define "scaler.image" -}}
{{- $image := .Values.image -}}
{{- $name := $image.repository -}}
{{- if not $name }}{{ fail "image.repository: give the image's repository" }}{{ end -}}
{{- with $image.registry }}{{ $name = printf "%s/%s" (trimSuffix "/" .) $name }}{{ end -}}
{{- if $image.digest -}}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" $image.digest) -}}
{{- fail (printf "image.digest: %q is not sha256: and 64 hex digits (the digest scripts/build-image prints)" $image.digest) -}}
{{- end -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default .Chart.AppVersion $image.tag) -}}
{{- end -}}
{{- end -}}

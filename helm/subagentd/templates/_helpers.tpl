{{/*
Names and labels.
*/}}
{{- define "subagentd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "subagentd.fullname" -}}
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

{{- define "subagentd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "subagentd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "subagentd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "subagentd.labels" -}}
helm.sh/chart: {{ include "subagentd.chart" . }}
{{ include "subagentd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "subagentd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "subagentd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "subagentd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Fixed container ports: the config's listen addresses use them.
*/}}
{{- define "subagentd.grpcContainerPort" -}}50051{{- end }}
{{- define "subagentd.metricsContainerPort" -}}9464{{- end }}
{{- define "subagentd.httpContainerPort" -}}50080{{- end }}

{{/*
The environment variable that holds an openai agent's API key: apiKeyEnv, or
AGENT_<NAME>_API_KEY (upper case, anything but A-Z and 0-9 becomes "_").
Called with (list $name $agent).
*/}}
{{- define "subagentd.apiKeyEnv" -}}
{{- $name := index . 0 }}
{{- $agent := index . 1 }}
{{- if $agent.apiKeyEnv }}
{{- $agent.apiKeyEnv }}
{{- else }}
{{- printf "AGENT_%s_API_KEY" (regexReplaceAll "[^A-Z0-9]" (upper $name) "_") }}
{{- end }}
{{- end }}

{{/*
Fixed paths: the embedded store's data directory (the image's VOLUME), the
directory of the PostgreSQL password file (a Secret volume) and that of the
PostgreSQL TLS files (a projected volume of one or two Secrets).
*/}}
{{- define "subagentd.dataDir" -}}/var/lib/subagentd{{- end }}
{{- define "subagentd.postgresSecretDir" -}}/var/run/secrets/subagentd/postgres{{- end }}
{{- define "subagentd.postgresTlsDir" -}}/var/run/secrets/subagentd/postgres-tls{{- end }}

{{/* "true" when the PostgreSQL TLS files are mounted (store.postgres.tls), else "". */}}
{{- define "subagentd.postgresTls" -}}
{{- $pg := .Values.store.postgres }}
{{- if and (eq (toString .Values.store.backend) "postgres") $pg.tls (or $pg.tls.caSecret $pg.tls.clientCertSecret) }}true{{ end }}
{{- end }}

{{/* The PersistentVolumeClaim of the embedded store: existingClaim or the chart's own. */}}
{{- define "subagentd.dataClaimName" -}}
{{- default (printf "%s-data" (include "subagentd.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{/*
The longest command kill_grace among a map of agent types, in seconds (5, the
default, when none is set).
*/}}
{{- define "subagentd.longestKillGrace" -}}
{{- $kill := 5 }}
{{- range $name, $agent := . }}
{{- if and (eq (toString $agent.runner) "command") (hasKey $agent "killGraceSeconds") }}
{{- $kill = max $kill (int $agent.killGraceSeconds) }}
{{- end }}
{{- end }}
{{- $kill }}
{{- end }}

{{/*
terminationGracePeriodSeconds: shutdown grace + the longest command kill
grace + margin.
*/}}
{{- define "subagentd.terminationGracePeriodSeconds" -}}
{{- add (int .Values.server.shutdownGraceSeconds) (include "subagentd.longestKillGrace" .Values.agents | int) (int .Values.terminationGraceMarginSeconds) }}
{{- end }}

{{/*
The workers' terminationGracePeriodSeconds: drain grace + the longest command
kill grace of their types + margin, so a drain is never cut short.
*/}}
{{- define "subagentd.workerTerminationGracePeriodSeconds" -}}
{{- add (int .Values.worker.drainGraceSeconds) (include "subagentd.longestKillGrace" .Values.worker.agents | int) (int .Values.terminationGraceMarginSeconds) }}
{{- end }}

{{/*
Environment variables holding the API keys of openai agent types, from their
Secrets. Called with a map of agent types.
*/}}
{{- define "subagentd.apiKeyEnvVars" -}}
{{- range $name, $agent := . }}
{{- with $agent.apiKeySecret }}
# API key of agent type {{ $name | quote }} (its api_key_env).
- name: {{ include "subagentd.apiKeyEnv" (list $name $agent) }}
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end }}
{{- end }}

{{/* The workers' name and selector labels. */}}
{{- define "subagentd.workerName" -}}
{{- printf "%s-worker" (include "subagentd.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- /*
The workers' app.kubernetes.io/name differs from the servers': the servers'
Service, Deployment selector and PodDisruptionBudget must never match a worker
pod (and a Deployment's selector cannot change on upgrade).
*/}}
{{- define "subagentd.workerSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-worker" (include "subagentd.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- define "subagentd.workerLabels" -}}
helm.sh/chart: {{ include "subagentd.chart" . }}
{{ include "subagentd.workerSelectorLabels" . }}
app.kubernetes.io/component: worker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The server's address as the workers reach it: the chart's Service, so any
ready server (a standby forwards to the leader).
*/}}
{{- define "subagentd.serverUrl" -}}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" (ne (toString .Values.tls.secret) "")) (include "subagentd.fullname" .) .Release.Namespace (int .Values.service.grpcPort) }}
{{- end }}

{{/*
TOML values. Strings are written as JSON strings, which are valid TOML basic
strings (same escapes; toJson writes <, > and & as \u escapes, also valid).
*/}}
{{- define "subagentd.tomlString" -}}
{{- toString . | toJson }}
{{- end }}

{{/* An integer (Helm reads YAML numbers as float64: never print them raw). */}}
{{- define "subagentd.tomlInt" -}}
{{- int64 . }}
{{- end }}

{{/* A float that TOML reads as a float (1 → 1.0). */}}
{{- define "subagentd.tomlFloat" -}}
{{- $f := float64 . }}
{{- if eq $f (floor $f) }}{{ printf "%.1f" $f }}{{ else }}{{ $f }}{{ end }}
{{- end }}

{{/* A TOML inline table of strings from a map. */}}
{{- define "subagentd.tomlStringTable" -}}
{{- $pairs := list }}
{{- range $k, $v := . }}
{{- $pairs = append $pairs (printf "%s = %s" (toJson $k) (toString $v | toJson)) }}
{{- end }}
{{- printf "{ %s }" (join ", " $pairs) }}
{{- end }}

{{/*
The server's config file, from the values. Listen addresses are fixed to the
container ports on all interfaces.
*/}}
{{- define "subagentd.configToml" -}}
{{- $v := .Values -}}
# Rendered by the subagentd Helm chart from its values; edit the values, not this.
[server]
listen = "0.0.0.0:{{ include "subagentd.grpcContainerPort" . }}"
keepalive_interval = {{ include "subagentd.tomlString" $v.server.keepaliveInterval }}
keepalive_timeout = {{ include "subagentd.tomlString" $v.server.keepaliveTimeout }}
shutdown_grace = "{{ int64 $v.server.shutdownGraceSeconds }}s"
{{- with $v.server }}
{{- if hasKey . "maxConcurrentStreams" }}
max_concurrent_streams = {{ include "subagentd.tomlInt" .maxConcurrentStreams }}
{{- end }}
{{- if hasKey . "maxHeaderListBytes" }}
max_header_list_bytes = {{ include "subagentd.tomlInt" .maxHeaderListBytes }}
{{- end }}
{{- if hasKey . "maxMessageBytes" }}
max_message_bytes = {{ include "subagentd.tomlInt" .maxMessageBytes }}
{{- end }}
{{- if hasKey . "maxPendingResetStreams" }}
max_pending_reset_streams = {{ include "subagentd.tomlInt" .maxPendingResetStreams }}
{{- end }}
{{- end }}
{{- if $v.tls.secret }}
health_listen = "0.0.0.0:{{ int64 $v.tls.healthPort }}"

[server.tls]
cert_file = "{{ include "subagentd.tlsDir" . }}/tls.crt"
key_file = "{{ include "subagentd.tlsDir" . }}/tls.key"
{{- if ne (toString $v.tls.clientAuth) "none" }}
client_ca_file = "{{ include "subagentd.tlsDir" . }}/ca.crt"
{{- end }}
client_auth = {{ include "subagentd.tomlString" $v.tls.clientAuth }}
{{- end }}

[ha]
{{- with $v.ha }}
{{- if hasKey . "leaseTtl" }}
lease_ttl = {{ include "subagentd.tomlString" .leaseTtl }}
{{- end }}
{{- if .tlsServerName }}
tls_server_name = {{ include "subagentd.tomlString" .tlsServerName }}
{{- end }}
{{- if and .tlsCaFromSecret $v.tls.secret }}
tls_ca_file = "{{ include "subagentd.tlsDir" $ }}/ca.crt"
{{- end }}
{{- end }}

[auth]
mode = {{ include "subagentd.tomlString" $v.auth.mode }}
allow_unauthenticated = {{ $v.auth.allowUnauthenticated | default false }}
{{- if and (eq (toString $v.auth.mode) "required") $v.auth.keysSecret }}
keys_dir = "{{ include "subagentd.keysDir" . }}"
{{- end }}
{{- with $v.auth.jwt }}
{{- if .issuer }}

[auth.jwt]
issuer = {{ include "subagentd.tomlString" .issuer }}
audience = {{ include "subagentd.tomlString" .audience }}
jwks_url = {{ include "subagentd.tomlString" .jwksUrl }}
{{- if hasKey . "jwksRefresh" }}
jwks_refresh = {{ include "subagentd.tomlString" .jwksRefresh }}
{{- end }}
{{- if hasKey . "permissionsClaim" }}
permissions_claim = {{ include "subagentd.tomlString" .permissionsClaim }}
{{- end }}
{{- if hasKey . "leeway" }}
leeway = {{ include "subagentd.tomlString" .leeway }}
{{- end }}
{{- end }}
{{- end }}
{{- range $v.auth.certs }}

[[auth.certs]]
san = {{ include "subagentd.tomlString" .san }}
tenant = {{ include "subagentd.tomlString" .tenant }}
roles = {{ toJson .roles }}
{{- if .agentTypes }}
agent_types = {{ toJson .agentTypes }}
{{- end }}
{{- end }}
{{- range $name, $t := $v.tenants }}

[tenants.{{ toJson $name }}]
{{- if hasKey $t "maxBackgroundAgents" }}
max_background_agents = {{ include "subagentd.tomlInt" $t.maxBackgroundAgents }}
{{- end }}
{{- if hasKey $t "spawnRate" }}
spawn_rate = {{ float64 $t.spawnRate }}
{{- end }}
{{- if hasKey $t "spawnBurst" }}
spawn_burst = {{ include "subagentd.tomlInt" $t.spawnBurst }}
{{- end }}
{{- end }}

[limits]
{{- with $v.limits }}
{{- if hasKey . "maxBackgroundAgents" }}
max_background_agents = {{ include "subagentd.tomlInt" .maxBackgroundAgents }}
{{- end }}
{{- if hasKey . "defaultConcurrency" }}
default_concurrency = {{ include "subagentd.tomlInt" .defaultConcurrency }}
{{- end }}
{{- if hasKey . "maxConcurrentPerParent" }}
max_concurrent_per_parent = {{ include "subagentd.tomlInt" .maxConcurrentPerParent }}
{{- end }}
{{- if hasKey . "maxDepth" }}
max_depth = {{ include "subagentd.tomlInt" .maxDepth }}
{{- end }}
{{- if hasKey . "maxLiveDescendantsPerRoot" }}
max_live_descendants_per_root = {{ include "subagentd.tomlInt" .maxLiveDescendantsPerRoot }}
{{- end }}
{{- if hasKey . "maxPromptBytes" }}
max_prompt_bytes = {{ include "subagentd.tomlInt" .maxPromptBytes }}
{{- end }}
{{- if hasKey . "maxWatchersPerTenant" }}
max_watchers_per_tenant = {{ include "subagentd.tomlInt" .maxWatchersPerTenant }}
{{- end }}

[limits.provider_concurrency]
{{- range $provider, $limit := .providerConcurrency }}
{{ toJson $provider }} = {{ include "subagentd.tomlInt" $limit }}
{{- end }}

[limits.model_concurrency]
{{- range $model, $limit := .modelConcurrency }}
{{ toJson $model }} = {{ include "subagentd.tomlInt" $limit }}
{{- end }}
{{- end }}

[runs]
{{- with $v.runs }}
{{- range $key, $toml := dict "defaultTimeout" "default_timeout" "finishedRetention" "finished_retention" "cancelGrace" "cancel_grace" "staleTimeout" "stale_timeout" "workerReattachGrace" "worker_reattach_grace" }}
{{- if hasKey $.Values.runs $key }}
{{ $toml }} = {{ include "subagentd.tomlString" (index $.Values.runs $key) }}
{{- end }}
{{- end }}
{{- if hasKey . "maxToolCalls" }}
max_tool_calls = {{ include "subagentd.tomlInt" .maxToolCalls }}
{{- end }}
{{- if hasKey . "maxIdenticalToolCalls" }}
max_identical_tool_calls = {{ include "subagentd.tomlInt" .maxIdenticalToolCalls }}
{{- end }}
{{- end }}

[watch]
{{- with $v.watch }}
{{- if hasKey . "history" }}
history = {{ include "subagentd.tomlInt" .history }}
{{- end }}
{{- if hasKey . "subscriberBuffer" }}
subscriber_buffer = {{ include "subagentd.tomlInt" .subscriberBuffer }}
{{- end }}
{{- end }}

[conversations]
{{- with $v.conversations }}
{{- if hasKey . "retention" }}
retention = {{ include "subagentd.tomlString" .retention }}
{{- end }}
{{- if hasKey . "maxTranscriptBytes" }}
max_transcript_bytes = {{ include "subagentd.tomlInt" .maxTranscriptBytes }}
{{- end }}
{{- end }}

[mcp]
{{- with $v.mcp }}
{{- if hasKey . "approvals" }}
approvals = {{ include "subagentd.tomlString" .approvals }}
{{- end }}
{{- if hasKey . "maxAwait" }}
max_await = {{ include "subagentd.tomlString" .maxAwait }}
{{- end }}
{{- if hasKey . "maxResultChars" }}
max_result_chars = {{ include "subagentd.tomlInt" .maxResultChars }}
{{- end }}
{{- end }}

[http]
listen = {{ if $v.http.enabled }}"0.0.0.0:{{ include "subagentd.httpContainerPort" . }}"{{ else }}""{{ end }}
{{- if and $v.http.enabled $v.http.tls $v.tls.secret }}
tls = true
{{- end }}

[store]
backend = {{ include "subagentd.tomlString" $v.store.backend }}
{{- if eq (toString $v.store.backend) "embedded" }}
path = "{{ include "subagentd.dataDir" . }}"
{{- end }}
{{- if eq (toString $v.store.backend) "postgres" }}
{{- with $v.store.postgres }}
{{- if .url }}
url = {{ include "subagentd.tomlString" .url }}
{{- end }}
{{- if .existingSecret }}
password_file = "{{ include "subagentd.postgresSecretDir" $ }}/password"
{{- end }}
{{- if hasKey . "poolSize" }}
pool_size = {{ include "subagentd.tomlInt" .poolSize }}
{{- end }}
{{- if include "subagentd.postgresTls" $ }}
{{- if .tls.caSecret }}
tls_ca_file = "{{ include "subagentd.postgresTlsDir" $ }}/ca.crt"
{{- end }}
{{- if .tls.clientCertSecret }}
tls_cert_file = "{{ include "subagentd.postgresTlsDir" $ }}/tls.crt"
tls_key_file = "{{ include "subagentd.postgresTlsDir" $ }}/tls.key"
{{- end }}
{{- end }}
{{- end }}
{{- end }}

[telemetry]
metrics_listen = {{ if $v.metrics.enabled }}"0.0.0.0:{{ include "subagentd.metricsContainerPort" . }}"{{ else }}""{{ end }}
{{- if and $v.metrics.enabled $v.metrics.tokenSecret }}
metrics_token_file = "{{ include "subagentd.metricsTokenDir" . }}/token"
{{- end }}
{{- if and $v.metrics.enabled $v.metrics.tls $v.tls.secret }}
metrics_tls = true
{{- end }}
{{- include "subagentd.telemetryToml" $v.telemetry }}
{{- include "subagentd.agentsToml" $v.agents }}
{{- end }}

{{/*
The [telemetry] keys the server and the workers share, from telemetry.*:
traces and the log format.
*/}}
{{- define "subagentd.telemetryToml" -}}
{{- with . }}
{{- if hasKey . "otlpEndpoint" }}
otlp_endpoint = {{ include "subagentd.tomlString" .otlpEndpoint }}
{{- end }}
{{- if hasKey . "serviceName" }}
service_name = {{ include "subagentd.tomlString" .serviceName }}
{{- end }}
{{- if hasKey . "resourceAttributes" }}
resource_attributes = {{ include "subagentd.tomlString" .resourceAttributes }}
{{- end }}
{{- if hasKey . "tracesSampler" }}
traces_sampler = {{ include "subagentd.tomlString" .tracesSampler }}
{{- end }}
{{- if hasKey . "tracesSamplerArg" }}
traces_sampler_arg = {{ include "subagentd.tomlString" .tracesSamplerArg }}
{{- end }}
{{- if hasKey . "logFormat" }}
log_format = {{ include "subagentd.tomlString" .logFormat }}
{{- end }}
{{- end }}
{{- end }}

{{/*
[agents.NAME] sections from a map of agent types (the server's agents or the
worker's worker.agents): the same keys in both files.
*/}}
{{- define "subagentd.agentsToml" -}}
{{- $agents := . -}}
{{- range $name, $agent := $agents }}

[agents.{{ toJson $name }}]
runner = {{ include "subagentd.tomlString" $agent.runner }}
{{- if hasKey $agent "defaultModel" }}
default_model = {{ include "subagentd.tomlString" $agent.defaultModel }}
{{- end }}
{{- if hasKey $agent "description" }}
description = {{ include "subagentd.tomlString" $agent.description }}
{{- end }}
{{- if hasKey $agent "continuable" }}
continuable = {{ $agent.continuable }}
{{- end }}
{{- if $agent.fallbackModels }}
fallback_models = {{ toJson $agent.fallbackModels }}
{{- end }}
{{- if hasKey $agent "maxTurns" }}
max_turns = {{ include "subagentd.tomlInt" $agent.maxTurns }}
{{- end }}
{{- if hasKey $agent "graceTurns" }}
grace_turns = {{ include "subagentd.tomlInt" $agent.graceTurns }}
{{- end }}
{{- if hasKey $agent "wrapUpMessage" }}
wrap_up_message = {{ include "subagentd.tomlString" $agent.wrapUpMessage }}
{{- end }}
{{- if eq (toString $agent.runner) "worker" }}
{{- if hasKey $agent "retryOnWorkerLost" }}
retry_on_worker_lost = {{ include "subagentd.tomlInt" $agent.retryOnWorkerLost }}
{{- end }}
{{- else if hasKey $agent "retryOnRestart" }}
retry_on_restart = {{ include "subagentd.tomlInt" $agent.retryOnRestart }}
{{- end }}
{{- if eq (toString $agent.runner) "command" }}
command = {{ toJson $agent.command }}
{{- if $agent.cwd }}
cwd = {{ include "subagentd.tomlString" $agent.cwd }}
{{- end }}
{{- if $agent.env }}
env = {{ include "subagentd.tomlStringTable" $agent.env }}
{{- end }}
{{- if $agent.prompt }}
prompt = {{ include "subagentd.tomlString" $agent.prompt }}
{{- end }}
{{- if $agent.steer }}
steer = {{ include "subagentd.tomlString" $agent.steer }}
{{- end }}
{{- if hasKey $agent "killGraceSeconds" }}
kill_grace = "{{ int64 $agent.killGraceSeconds }}s"
{{- end }}
{{- if hasKey $agent "maxResultBytes" }}
max_result_bytes = {{ include "subagentd.tomlInt" $agent.maxResultBytes }}
{{- end }}
{{- if $agent.continueArgs }}
continue_args = {{ toJson $agent.continueArgs }}
{{- end }}
{{- end }}
{{- if eq (toString $agent.runner) "openai" }}
base_url = {{ include "subagentd.tomlString" $agent.baseUrl }}
{{- if or $agent.apiKeyEnv $agent.apiKeySecret }}
api_key_env = {{ include "subagentd.tomlString" (include "subagentd.apiKeyEnv" (list $name $agent)) }}
{{- end }}
{{- if hasKey $agent "systemPrompt" }}
system_prompt = {{ include "subagentd.tomlString" $agent.systemPrompt }}
{{- end }}
{{- if hasKey $agent "maxTokens" }}
max_tokens = {{ include "subagentd.tomlInt" $agent.maxTokens }}
{{- end }}
{{- if hasKey $agent "temperature" }}
temperature = {{ include "subagentd.tomlFloat" $agent.temperature }}
{{- end }}
{{- if $agent.modelMap }}
model_map = {{ include "subagentd.tomlStringTable" $agent.modelMap }}
{{- end }}
{{- if hasKey $agent "requestTimeout" }}
request_timeout = {{ include "subagentd.tomlString" $agent.requestTimeout }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The worker's config file (`subagentd worker --config`): [worker], its agent
types, [telemetry] (traces and the log format; a worker serves no metrics).
*/}}
{{- define "subagentd.workerConfigToml" -}}
{{- $w := .Values.worker -}}
# Rendered by the subagentd Helm chart from worker.*; edit the values, not this.
[worker]
capacity = {{ include "subagentd.tomlInt" $w.capacity }}
drain_grace = "{{ int64 $w.drainGraceSeconds }}s"
{{- if $w.labels }}
labels = {{ include "subagentd.tomlStringTable" $w.labels }}
{{- end }}

[telemetry]
metrics_listen = ""
{{- include "subagentd.telemetryToml" .Values.telemetry }}
{{- include "subagentd.agentsToml" $w.agents }}
{{- end }}

{{/*
Where the API keys Secret is mounted: [auth] keys_dir.
*/}}
{{- define "subagentd.keysDir" -}}
/var/run/secrets/subagentd/keys
{{- end }}

{{- define "subagentd.tlsDir" -}}
/var/run/secrets/subagentd/tls
{{- end }}

{{- define "subagentd.metricsTokenDir" -}}
/var/run/secrets/subagentd/metrics
{{- end }}

{{/*
The auth rules JSON Schema cannot state: a key Secret for mode required (and
a worker key for the workers), and an explicit opt-in for mode none.
*/}}
{{- define "subagentd.checkAuth" -}}
{{- $a := .Values.auth -}}
{{- if and (not .Values.tls.secret) (ne (toString .Values.tls.clientAuth) "none") }}
{{- fail "tls.clientAuth: client certificates need TLS: set tls.secret (a kubernetes.io/tls Secret with ca.crt)" }}
{{- end }}
{{- if and .Values.metrics.tls (not .Values.tls.secret) }}
{{- fail "metrics.tls: serves tls.secret's certificate: set tls.secret" }}
{{- end }}
{{- if and .Values.http.tls (not .Values.tls.secret) }}
{{- fail "http.tls: serves /mcp with tls.secret's certificate: set tls.secret" }}
{{- end }}
{{- if and .Values.worker.enabled .Values.tls.secret (not .Values.worker.tlsSecret) }}
{{- fail "worker.tlsSecret: with tls.secret the workers need a kubernetes.io/tls Secret with ca.crt (to verify the server) and their client certificate" }}
{{- end }}
{{- if and .Values.ha.tlsCaFromSecret (not .Values.tls.secret) }}
{{- fail "ha.tlsCaFromSecret: verifies the leader against tls.secret's ca.crt: set tls.secret" }}
{{- end }}
{{- if eq (toString $a.mode) "required" }}
{{- if and (not $a.keysSecret) (not $a.certs) (not (and $a.jwt $a.jwt.issuer)) }}
{{- fail "auth.keysSecret: auth.mode required (the default) needs an existing Secret of API keys (one entry per key id; `subagentd keys new --file-form`), auth.certs or auth.jwt; or choose unauthenticated serving explicitly with auth.mode: none and auth.allowUnauthenticated: true" }}
{{- end }}
{{- if and .Values.worker.enabled (not .Values.worker.tokenSecret) (not .Values.worker.tlsSecret) }}
{{- fail "worker.tokenSecret: with auth.mode required the workers need an API key with the worker role, from an existing Secret (worker.tokenSecret, worker.tokenKey), or a client certificate mapped in auth.certs (worker.tlsSecret)" }}
{{- end }}
{{- if and $a.certs (eq (toString $.Values.tls.clientAuth) "none") }}
{{- fail "auth.certs: certificate principals need client certificates: set tls.secret and tls.clientAuth (optional or required)" }}
{{- end }}
{{- else if not $a.allowUnauthenticated }}
{{- fail "auth.allowUnauthenticated: auth.mode none serves every agent to anyone on the pod network; set auth.allowUnauthenticated: true to accept that" }}
{{- end }}
{{- end }}

{{/* The port the kubelet probes: the gRPC port, or with TLS the plaintext health-only one. */}}
{{- define "subagentd.probePort" -}}
{{- if .Values.tls.secret }}{{ int64 .Values.tls.healthPort }}{{ else }}{{ include "subagentd.grpcContainerPort" . }}{{ end }}
{{- end }}

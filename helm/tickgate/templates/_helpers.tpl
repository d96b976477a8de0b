{{/* The chart name, overridable. */}}
{{- define "tickgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's objects, at most 63 characters. */}}
{{- define "tickgate.fullname" -}}
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

{{- define "tickgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tickgate.labels" -}}
helm.sh/chart: {{ include "tickgate.chart" . }}
{{ include "tickgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tickgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tickgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The optional scheduler-only Deployment's name and labels. Its pods' name label differs
from the main pods', so neither the main Deployment's selector nor the Service's picks
them up (both select by name and instance).
*/}}
{{- define "tickgate.schedulerName" -}}
{{- printf "%s-scheduler" (include "tickgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tickgate.schedulerSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-scheduler" (include "tickgate.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end }}

{{- define "tickgate.schedulerLabels" -}}
helm.sh/chart: {{ include "tickgate.chart" . }}
{{ include "tickgate.schedulerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tickgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tickgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tickgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/*
Checks the database settings and fails rendering with a clear message when they are
missing or ambiguous. Every template that needs the database includes it.
*/}}
{{- define "tickgate.validateDatabase" -}}
{{- $db := .Values.database }}
{{- if and $db.url $db.existingSecret }}
{{- fail "tickgate: set only one of database.url and database.existingSecret" }}
{{- end }}
{{- if not (or $db.url $db.existingSecret) }}
{{- fail "tickgate: no database configured. Set database.url (e.g. --set database.url=postgresql://user:pass@host:5432/tickgate) or database.existingSecret (a Secret holding the DSN under database.existingSecretKey, default DATABASE_URL). The chart never starts an embedded PostgreSQL." }}
{{- end }}
{{- end }}

{{/* The Secret holding DATABASE_URL: the chart's own, or database.existingSecret. */}}
{{- define "tickgate.databaseSecretName" -}}
{{- include "tickgate.validateDatabase" . }}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else }}
{{- printf "%s-database" (include "tickgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tickgate.databaseSecretKey" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecretKey | default "DATABASE_URL" }}
{{- else -}}
DATABASE_URL
{{- end }}
{{- end }}

{{/*
Where the pods read the DSN (DATABASE_URL_FILE): a file, like the tokens, so that no DSN
is in a process environment (/proc/<pid>/environ, what child processes inherit).
*/}}
{{- define "tickgate.databaseUrlFile" -}}
/var/run/secrets/tickgate-database/database-url
{{- end }}

{{/* The Secret volume of the DSN file, from the chart's Secret or database.existingSecret. */}}
{{- define "tickgate.databaseVolume" -}}
secret:
  secretName: {{ include "tickgate.databaseSecretName" . }}
  defaultMode: {{ ternary 0440 0444 (hasKey .Values.podSecurityContext "fsGroup") }}
  items:
    - key: {{ include "tickgate.databaseSecretKey" . }}
      path: {{ base (include "tickgate.databaseUrlFile" .) }}
{{- end }}

{{/* Where the pods read the sql task's targets and `self` DSN, from tasks.sql.existingSecret. */}}
{{- define "tickgate.sqlTargetsFile" -}}
/var/run/secrets/tickgate-sql/targets.json
{{- end }}

{{- define "tickgate.sqlSelfUrlFile" -}}
/var/run/secrets/tickgate-sql/self-url
{{- end }}

{{/* The ConfigMap of declarative jobs. */}}
{{- define "tickgate.jobsConfigMapName" -}}
{{- printf "%s-jobs" (include "tickgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The jobs file: the `jobs` list as JSON, which is also YAML. JSON quotes every string, so
values such as "03:00" or "2026-12-01T10:00:00+02:00" stay strings for any YAML 1.1
reader (PyYAML would read unquoted 03:00 as the integer 180). Fails on duplicate names.
*/}}
{{- define "tickgate.jobsFile" -}}
{{- $seen := dict }}
{{- range .Values.jobs }}
{{- if hasKey $seen .name }}
{{- fail (printf "tickgate: jobs: the name %q is declared twice" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- end }}
{{- toPrettyJson .Values.jobs }}
{{- end }}

{{/* Container settings shared by the Deployment and the migration Job. */}}
{{- define "tickgate.settingsEnv" -}}
- name: TICKGATE_REQUIRE_DATABASE_URL
  value: "1"
- name: TICKGATE_API_POOL_SIZE
  value: {{ .Values.apiPoolSize | quote }}
- name: TICKGATE_LOCK_SESSIONS
  value: {{ .Values.lockSessions | quote }}
- name: TICKGATE_MAX_CONCURRENT_RUNS
  value: {{ .Values.maxConcurrentRuns | quote }}
- name: TICKGATE_OWNERSHIP
  value: {{ .Values.ownership | quote }}
- name: TICKGATE_TAKEOVER_SECONDS
  value: {{ .Values.takeoverSeconds | quote }}
- name: TICKGATE_DB_LINK_TIMEOUT_SECONDS
  value: {{ .Values.dbLinkTimeoutSeconds | quote }}
- name: TICKGATE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: TICKGATE_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
{{- end }}

{{/*
Settings of the serving pods only (the migration Job runs no scheduler and no task).
*/}}
{{- define "tickgate.runtimeEnv" -}}
{{- if and (not .Values.scheduler) .Values.schedulerDeployment.enabled }}
{{- fail "tickgate: scheduler=false turns the scheduler off in every pod; it cannot be combined with schedulerDeployment.enabled" }}
{{- end }}
- name: TICKGATE_RECONCILE_SECONDS
  value: {{ .Values.reconcileSeconds | quote }}
- name: TICKGATE_RUN_HISTORY
  value: {{ .Values.runHistory | int | quote }}
- name: TICKGATE_TASK_MODULES
  value: {{ join "," .Values.tasks.modules | quote }}
- name: TICKGATE_HTTP_ALLOW
  value: {{ join "," .Values.tasks.http.allow | quote }}
- name: TICKGATE_HTTP_MAX_CONNECTIONS_PER_HOST
  value: {{ .Values.tasks.http.maxConnectionsPerHost | int | quote }}
- name: TICKGATE_HTTP_NEW_CONNECTIONS_PER_HOST
  value: {{ .Values.tasks.http.newConnectionsPerHost | int | quote }}
- name: TICKGATE_HTTP_CONNECT_TIMEOUT_SECONDS
  value: {{ .Values.tasks.http.connectTimeoutSeconds | quote }}
{{- if .Values.tasks.http.signing.existingSecret }}
- name: TICKGATE_WEBHOOK_KEYS_FILE
  value: {{ include "tickgate.webhookKeysFile" . | quote }}
{{- end }}
{{- if .Values.tasks.http.oauth.existingSecret }}
- name: TICKGATE_OAUTH_SECRETS_FILE
  value: {{ include "tickgate.oauthSecretsFile" . | quote }}
{{- end }}
{{- with .Values.tasks.http.signing.defaultKey }}
- name: TICKGATE_WEBHOOK_SIGNING_KEY
  value: {{ . | quote }}
{{- end }}
- name: TICKGATE_SQL_ALLOW_SELF
  value: {{ .Values.tasks.sql.allowSelf | quote }}
{{- if .Values.tasks.sql.allowSelf }}
{{- $_ := required "tasks.sql.allowSelf needs tasks.sql.existingSecret, holding TICKGATE_SQL_SELF_URL" .Values.tasks.sql.existingSecret }}
- name: TICKGATE_SQL_SELF_URL_FILE
  value: {{ include "tickgate.sqlSelfUrlFile" . | quote }}
{{- end }}
{{- if .Values.tasks.sql.existingSecret }}
- name: TICKGATE_SQL_TARGETS_FILE
  value: {{ include "tickgate.sqlTargetsFile" . | quote }}
{{- end }}
{{- with .Values.hooks.defaults }}
- name: TICKGATE_DEFAULT_HOOKS
  value: {{ toJson . | quote }}
{{- end }}
{{- with .Values.publicUrl }}
- name: TICKGATE_PUBLIC_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_TRACES_SAMPLER
  value: parentbased_traceidratio
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $.Values.tracing.sampleRatio | quote }}
{{- end }}
{{- end }}

{{/* The pod's terminationGracePeriodSeconds: preStop sleep + run grace + headroom. */}}
{{- define "tickgate.terminationGracePeriodSeconds" -}}
{{- add (int .Values.preStopSleepSeconds) (int .Values.shutdownGraceSeconds) (int .Values.terminationGraceHeadroomSeconds) }}
{{- end }}

{{/*
The JSON of TICKGATE_API_TOKENS: auth.tokens; else the token already in the cluster's
Secret (`lookup`, so an upgrade keeps it); else a new read+write token. A render without a
cluster (`helm template`, Argo CD, Flux's post-rendering) cannot look up, so it makes a new
token each time: GitOps should use auth.existingSecret. The result is kept for the rest of
the render, so the Secret and the pods' checksum/auth annotation agree.
*/}}
{{- define "tickgate.apiTokens" -}}
{{- $cache := .Values.auth }}
{{- if not (hasKey $cache "_rendered") }}
{{- $tokens := "" }}
{{- if .Values.auth.tokens }}
{{- $tokens = toJson .Values.auth.tokens }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tickgate.authSecretName" .) }}
{{- if and $existing (index ($existing.data | default dict) "TICKGATE_API_TOKENS") }}
{{- $tokens = index $existing.data "TICKGATE_API_TOKENS" | b64dec }}
{{- else }}
{{- $tokens = toJson (dict (randAlphaNum 40) (list "read" "write")) }}
{{- end }}
{{- end }}
{{- $_ := set $cache "_rendered" $tokens }}
{{- end }}
{{- get $cache "_rendered" }}
{{- end }}

{{/* The Secret holding TICKGATE_API_TOKENS. */}}
{{- define "tickgate.authSecretName" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else -}}
{{- printf "%s-auth" (include "tickgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end }}

{{/*
Where the pods read the API tokens (TICKGATE_API_TOKENS_FILE): the auth Secret's key
TICKGATE_API_TOKENS, mounted read-only. Its directory must not be the jobs file's, which
is another volume.
*/}}
{{/* Where the pods read the http task's signing keys (TICKGATE_WEBHOOK_KEYS_FILE). */}}
{{- define "tickgate.webhookKeysFile" -}}
/var/run/secrets/tickgate-webhook/webhook-keys.json
{{- end }}

{{/* Where the pods read the http task's OAuth client secrets (TICKGATE_OAUTH_SECRETS_FILE). */}}
{{- define "tickgate.oauthSecretsFile" -}}
/var/run/secrets/tickgate-oauth/oauth-secrets.json
{{- end }}

{{- define "tickgate.apiTokensFile" -}}
/var/run/secrets/tickgate/api-tokens.json
{{- end }}

{{/* The Secret volume of the tokens file; group-readable only when fsGroup makes the
pod's group own it. */}}
{{- define "tickgate.apiTokensVolume" -}}
{{- if hasPrefix (printf "%s/" (dir .Values.jobsFile)) (include "tickgate.apiTokensFile" .) }}
{{- fail (printf "tickgate: jobsFile %s is in the directory of the API tokens file; choose another directory" .Values.jobsFile) }}
{{- end }}
secret:
  secretName: {{ include "tickgate.authSecretName" . }}
  defaultMode: {{ ternary 0440 0444 (hasKey .Values.podSecurityContext "fsGroup") }}
  items:
    - key: TICKGATE_API_TOKENS
      path: {{ base (include "tickgate.apiTokensFile" .) }}
{{- end }}

{{/*
The series of this release as its ServiceMonitor scrapes them: the labels Prometheus
Operator adds (namespace, and service for the API and the scheduler Services).
*/}}
{{- define "tickgate.metricsSelector" -}}
{{- if .Values.prometheusRule.selector }}
{{- .Values.prometheusRule.selector }}
{{- else }}
{{- printf "namespace=%q,service=~%q" .Release.Namespace (printf "%s|%s" (include "tickgate.fullname" .) (include "tickgate.schedulerName" .)) }}
{{- end }}
{{- end }}

{{/*
The helm test Pod's script (python's urllib: the image has no curl). It fails on any
answer but 200: first /readyz, then GET /v1/jobs with a read token from the tokens file.
*/}}
{{- define "tickgate.testScript" -}}
import json, os, urllib.request

url = os.environ["TICKGATE_URL"]
with urllib.request.urlopen(url + "/readyz", timeout=10) as answer:
    print("GET /readyz:", answer.status, json.load(answer)["status"])
with open(os.environ["TICKGATE_API_TOKENS_FILE"]) as file:
    token = next(t for t, scopes in json.load(file).items() if "read" in scopes)
request = urllib.request.Request(
    url + "/v1/jobs?limit=1", headers={"Authorization": "Bearer " + token}
)
with urllib.request.urlopen(request, timeout=10) as answer:
    print("GET /v1/jobs:", answer.status, len(json.load(answer)["items"]), "job(s)")
{{- end }}

{{/*
Fails when extraEnv repeats a variable the chart sets from a value of its own: Kubernetes
would let the later entry win without a word.
*/}}
{{- define "tickgate.checkExtraEnv" -}}
{{- $own := concat (include "tickgate.settingsEnv" . | fromYamlArray) (include "tickgate.runtimeEnv" . | fromYamlArray) }}
{{- range $own }}
{{- $name := .name }}
{{- range $.Values.extraEnv }}
{{- if eq .name $name }}
{{- fail (printf "tickgate: extraEnv sets %s, which the chart sets itself from its values (runHistory, tasks, logLevel, ...): set that value instead" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
One Deployment of Tickgate pods. `component` "" is the main Deployment: pods serving the
API and (unless schedulerDeployment.enabled) running the scheduler, in two processes of
`tickgate serve`. "scheduler" is the optional scheduler-only Deployment: no API, no
Service traffic, and the jobs file is left to the API pods (they apply it as PUT would).
*/}}
{{- define "tickgate.deployment" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $scheduler := eq .component "scheduler" }}
{{- $name := ternary (include "tickgate.schedulerName" $root) (include "tickgate.fullname" $root) $scheduler }}
{{- $labels := ternary (include "tickgate.schedulerLabels" $root) (include "tickgate.labels" $root) $scheduler }}
{{- $selector := ternary (include "tickgate.schedulerSelectorLabels" $root) (include "tickgate.selectorLabels" $root) $scheduler }}
{{- $jobs := and $v.jobs (not $scheduler) }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- $labels | nindent 4 }}
spec:
  {{- if $scheduler }}
  replicas: {{ $v.schedulerDeployment.replicaCount }}
  {{- else if not $v.autoscaling.enabled }}
  replicas: {{ $v.replicaCount }}
  {{- end }}
  {{- with $v.strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  selector:
    matchLabels:
      {{- $selector | nindent 6 }}
  template:
    metadata:
      annotations:
        {{- if not $v.database.existingSecret }}
        checksum/database: {{ include (print $root.Template.BasePath "/secret.yaml") $root | sha256sum }}
        {{- end }}
        {{- if not $v.auth.existingSecret }}
        {{- /* New tokens roll the pods, which read the tokens file at startup. */}}
        checksum/auth: {{ include "tickgate.apiTokens" $root | sha256sum }}
        {{- end }}
        {{- if $jobs }}
        checksum/jobs: {{ include (print $root.Template.BasePath "/configmap-jobs.yaml") $root | sha256sum }}
        {{- end }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      labels:
        {{- $labels | nindent 8 }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "tickgate.serviceAccountName" $root }}
      automountServiceAccountToken: {{ $v.serviceAccount.automountServiceAccountToken }}
      # No TICKGATE_PORT=tcp://... style variables from other Services in the namespace:
      # they share Tickgate's TICKGATE_ settings prefix.
      enableServiceLinks: false
      terminationGracePeriodSeconds: {{ include "tickgate.terminationGracePeriodSeconds" $root }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      containers:
        - name: tickgate
          image: {{ include "tickgate.image" $root | quote }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args: ["serve", "--host", "0.0.0.0", "--port", "{{ $v.containerPort }}"]
          ports:
            - name: http
              containerPort: {{ $v.containerPort }}
              protocol: TCP
          env:
            # Files rather than env vars: the DSN and the tokens are not in the process
            # environment (/proc/<pid>/environ, what child processes inherit, what a dump
            # of it shows).
            - name: DATABASE_URL_FILE
              value: {{ include "tickgate.databaseUrlFile" $root | quote }}
            - name: TICKGATE_API_TOKENS_FILE
              value: {{ include "tickgate.apiTokensFile" $root | quote }}
            - name: TICKGATE_RUNNER_ID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: TICKGATE_SHUTDOWN_GRACE_SECONDS
              value: {{ $v.shutdownGraceSeconds | quote }}
            {{- include "tickgate.settingsEnv" $root | nindent 12 }}
            {{- include "tickgate.runtimeEnv" $root | nindent 12 }}
            {{- if $jobs }}
            - name: TICKGATE_APPLY_JOBS
              value: {{ $v.jobsFile | quote }}
            {{- end }}
            {{- if $scheduler }}
            # Probes and /metrics only; the API is served by {{ include "tickgate.fullname" $root }}.
            - name: TICKGATE_API
              value: "false"
            {{- else if $v.schedulerDeployment.enabled }}
            # The scheduler runs in {{ include "tickgate.schedulerName" $root }}.
            - name: TICKGATE_SCHEDULER
              value: "false"
            {{- else if not $v.scheduler }}
            # scheduler=false: no pod of this release fires ticks.
            - name: TICKGATE_SCHEDULER
              value: "false"
            {{- end }}
            {{- with $v.extraEnv }}
            {{- include "tickgate.checkExtraEnv" $root }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with $v.extraEnvFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.startupProbe }}
          startupProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.livenessProbe }}
          livenessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- with $v.readinessProbe }}
          readinessProbe:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          {{- if gt (int $v.preStopSleepSeconds) 0 }}
          lifecycle:
            preStop:
              exec:
                command: ["sleep", "{{ int $v.preStopSleepSeconds }}"]
          {{- end }}
          resources:
            {{- toYaml (ternary $v.schedulerDeployment.resources $v.resources (and $scheduler (not (empty $v.schedulerDeployment.resources)))) | nindent 12 }}
          securityContext:
            {{- toYaml $v.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            - name: database
              mountPath: {{ dir (include "tickgate.databaseUrlFile" $root) | quote }}
              readOnly: true
            - name: api-tokens
              mountPath: {{ dir (include "tickgate.apiTokensFile" $root) | quote }}
              readOnly: true
            {{- if $v.tasks.http.signing.existingSecret }}
            - name: webhook-keys
              mountPath: {{ dir (include "tickgate.webhookKeysFile" $root) | quote }}
              readOnly: true
            {{- end }}
            {{- if $v.tasks.sql.existingSecret }}
            - name: sql-targets
              mountPath: {{ dir (include "tickgate.sqlTargetsFile" $root) | quote }}
              readOnly: true
            {{- end }}
            {{- if $v.tasks.http.oauth.existingSecret }}
            - name: oauth-secrets
              mountPath: {{ dir (include "tickgate.oauthSecretsFile" $root) | quote }}
              readOnly: true
            {{- end }}
            {{- if $jobs }}
            - name: jobs
              mountPath: {{ dir $v.jobsFile | quote }}
              readOnly: true
            {{- end }}
      volumes:
        - name: tmp
          {{- if $v.tmpVolume.sizeLimit }}
          emptyDir:
            sizeLimit: {{ $v.tmpVolume.sizeLimit | quote }}
          {{- else }}
          emptyDir: {}
          {{- end }}
        - name: database
          {{- include "tickgate.databaseVolume" $root | nindent 10 }}
        - name: api-tokens
          {{- include "tickgate.apiTokensVolume" $root | nindent 10 }}
        {{- with $v.tasks.sql.existingSecret }}
        - name: sql-targets
          secret:
            secretName: {{ . | quote }}
            defaultMode: {{ ternary 0440 0444 (hasKey $v.podSecurityContext "fsGroup") }}
            items:
              - key: {{ $v.tasks.sql.existingSecretKey | default "TICKGATE_SQL_TARGETS" }}
                path: {{ base (include "tickgate.sqlTargetsFile" $root) }}
              {{- if $v.tasks.sql.allowSelf }}
              - key: {{ $v.tasks.sql.selfUrlKey | default "TICKGATE_SQL_SELF_URL" }}
                path: {{ base (include "tickgate.sqlSelfUrlFile" $root) }}
              {{- end }}
        {{- end }}
        {{- with $v.tasks.http.signing.existingSecret }}
        - name: webhook-keys
          secret:
            secretName: {{ . | quote }}
            defaultMode: {{ ternary 0440 0444 (hasKey $v.podSecurityContext "fsGroup") }}
            items:
              - key: webhook-keys.json
                path: webhook-keys.json
        {{- end }}
        {{- with $v.tasks.http.oauth.existingSecret }}
        - name: oauth-secrets
          secret:
            secretName: {{ . | quote }}
            defaultMode: {{ ternary 0440 0444 (hasKey $v.podSecurityContext "fsGroup") }}
            items:
              - key: oauth-secrets.json
                path: oauth-secrets.json
        {{- end }}
        {{- if $jobs }}
        - name: jobs
          configMap:
            name: {{ include "tickgate.jobsConfigMapName" $root }}
            items:
              - key: jobs.yaml
                path: {{ base $v.jobsFile | quote }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}

{{/*
Names, labels, the image and the shared environment. Named templates are global to a chart tree,
so the service subcharts (rendered inside the umbrella chart) call these directly.
*/}}

{{/* <release>-<chart>: "tessera-scheduler" for the release "tessera" */}}
{{- define "tessera-lib.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<suffix>, for the objects the umbrella chart shares between services */}}
{{- define "tessera-lib.shared" -}}
{{- printf "%s-%s" .root.Release.Name .suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of one component: (dict "root" $ "component" "nats"); a service's component is its chart. */}}
{{- define "tessera-lib.selectorLabelsFor" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tessera-lib.labelsFor" -}}
{{ include "tessera-lib.selectorLabelsFor" . }}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/version: {{ .root.Chart.AppVersion | default .root.Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tessera-lib.selectorLabels" -}}
{{ include "tessera-lib.selectorLabelsFor" (dict "root" . "component" .Chart.Name) }}
{{- end -}}

{{- define "tessera-lib.labels" -}}
{{ include "tessera-lib.labelsFor" (dict "root" . "component" .Chart.Name) }}
{{- end -}}

{{- define "tessera-lib.image" -}}
{{- $image := .Values.global.image -}}
{{- printf "%s:%s" $image.repository ($image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The Secret and key holding the database URL: an existing Secret, or the one the umbrella chart writes
(from global.database.url, or for the evaluation Postgres). */}}
{{- define "tessera-lib.databaseSecret" -}}
{{- $db := .Values.global.database -}}
{{- if $db.existingSecret.name -}}
name: {{ $db.existingSecret.name }}
key: {{ $db.existingSecret.key }}
{{- else -}}
name: {{ include "tessera-lib.shared" (dict "root" . "suffix" "database") }}
key: url
{{- end -}}
{{- end -}}

{{/* global.nats.url, else the evaluation NATS the umbrella chart runs (it fails the render when neither). */}}
{{- define "tessera-lib.natsUrl" -}}
{{- .Values.global.nats.url | default (printf "nats://%s:4222" (include "tessera-lib.shared" (dict "root" . "suffix" "nats"))) -}}
{{- end -}}

{{/* Environment every Tessera container shares: NATS, the database, tracing. */}}
{{/*
With global.nats.auth.enabled each service connects as its own NATS user, tessera-<service>: its
password from the Secret's key <service> (global.nats.auth.existingSecret, else the one the chart
makes for the evaluation NATS) goes into the URL by Kubernetes' $(VAR) expansion, and its replies come
on its own inbox prefix, the only one its user may read.
*/}}
{{- define "tessera-lib.natsEnv" -}}
{{- $url := include "tessera-lib.natsUrl" . -}}
{{- $auth := .Values.global.nats.auth -}}
{{- if $auth.enabled -}}
{{- $user := printf "tessera-%s" .Chart.Name -}}
- name: NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret | default (include "tessera-lib.shared" (dict "root" . "suffix" "nats-users")) }}
      key: {{ .Chart.Name }}
- name: TESSERA_NATS_URL
  value: {{ regexReplaceAll "^([a-z]+://)(?:[^@/]*@)?" $url (printf "${1}%s:$(NATS_PASSWORD)@" $user) | quote }}
- name: TESSERA_{{ .Chart.Name | upper }}_NATS_INBOX_PREFIX
  value: {{ printf "_INBOX_%s" $user | quote }}
{{- else -}}
- name: TESSERA_NATS_URL
  value: {{ $url | quote }}
{{- end -}}
{{- end -}}

{{- define "tessera-lib.sharedEnv" -}}
{{ include "tessera-lib.natsEnv" . }}
- name: TESSERA_DATABASE_URL
  valueFrom:
    secretKeyRef:
      {{- include "tessera-lib.databaseSecret" . | nindent 6 }}
{{- with .Values.global.otlp.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $.Values.global.otlp.protocol | quote }}
{{- end }}
{{- end -}}

{{/*
A service's settings as TESSERA_<SERVICE>_<NAME> variables: (dict "prefix" "TESSERA_X_" "settings" map).
A group of settings (a map) or a list goes as JSON, which the service's pydantic settings parse.
*/}}
{{- define "tessera-lib.settingsEnv" -}}
{{- range $key, $value := .settings }}
- name: {{ printf "%s%s" $.prefix (upper $key) }}
  value: {{ if kindIs "string" $value }}{{ $value | quote }}{{ else }}{{ toJson $value | quote }}{{ end }}
{{- end }}
{{- end -}}

{{- define "tessera-lib.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "tessera-lib.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

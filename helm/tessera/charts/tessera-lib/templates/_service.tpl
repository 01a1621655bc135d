{{/*
Everything one Tessera service deploys: ServiceAccount, RBAC, the workload, its Service and its
PodDisruptionBudget. A service chart's only template calls it:

  {{ include "tessera-lib.service" (dict "ctx" . "kind" "Deployment") }}

with, optionally, "env" / "volumes" / "volumeMounts" / "ports" (container ports after http) /
"servicePorts" (Service ports after http) (lists), "podAnnotations" (a map added to the values'),
"pod" (fields added to the pod spec), "roleNamespace" (where the Role of rbac.namespaceRules goes; the
release namespace by default) and "roles" (a list of (dict "namespace" NS "rules" RULES): more rules
granted in one namespace only; rules for the same namespace share its Role "<name>").
"asksAdmission" true: the service checks tenants' bearer tokens with admission, so its
settings.admission_url defaults to the release's admission Service (http://<release>-admission:8080).
rbac.releaseRules go in a Role "<name>-release" where the service keeps its leader's Lease:
settings.leader_election.namespace when set, else the release namespace.
*/}}
{{- define "tessera-lib.service" -}}
{{- $ := .ctx -}}
{{- $v := $.Values -}}
{{- $name := include "tessera-lib.fullname" $ -}}
{{- $prefix := printf "TESSERA_%s_" (upper $.Chart.Name) -}}
{{- $kubeApi := (($v.kubernetesApi | default dict).enabled | default false) -}}
{{- $roleNamespace := .roleNamespace | default $.Release.Namespace -}}
{{- $sa := $v.serviceAccount.name | default $name -}}
{{- if $v.serviceAccount.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $sa }}
  labels:
    {{- include "tessera-lib.labels" $ | nindent 4 }}
  {{- with $v.serviceAccount.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: {{ $kubeApi }}
{{- end }}
{{- if and $kubeApi $v.rbac.create }}
{{- $roleArgs := dict "ctx" $ "sa" $sa }}
{{- if $v.rbac.clusterRules }}
{{- include "tessera-lib.role" (merge (dict "kind" "ClusterRole" "name" $name "rules" $v.rbac.clusterRules) $roleArgs) }}
{{- end }}
{{- /* Roles by namespace: rbac.namespaceRules in roleNamespace, then each of .roles; one Role per namespace */}}
{{- $namespaced := dict }}
{{- range prepend (.roles | default list) (dict "namespace" $roleNamespace "rules" $v.rbac.namespaceRules) }}
{{- if .rules }}
{{- $_ := set $namespaced .namespace (concat (get $namespaced .namespace | default list) .rules) }}
{{- end }}
{{- end }}
{{- range $namespace := keys $namespaced | sortAlpha }}
{{- include "tessera-lib.role" (merge (dict "kind" "Role" "name" $name "namespace" $namespace "rules" (get $namespaced $namespace)) $roleArgs) }}
{{- end }}
{{- if $v.rbac.releaseRules }}
{{- $election := (($v.settings | default dict).leader_election | default dict) }}
{{- $leaseNamespace := $election.namespace | default $.Release.Namespace }}
{{- include "tessera-lib.role" (merge (dict "kind" "Role" "name" (printf "%s-release" $name) "namespace" $leaseNamespace "rules" $v.rbac.releaseRules) $roleArgs) }}
{{- end }}
{{- end }}
---
apiVersion: apps/v1
kind: {{ .kind }}
metadata:
  name: {{ $name }}
  labels:
    {{- include "tessera-lib.labels" $ | nindent 4 }}
spec:
  {{- if eq .kind "Deployment" }}
  replicas: {{ $v.replicaCount }}
  {{- with $v.strategy }}
  strategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- else }}
  {{- with $v.updateStrategy }}
  updateStrategy:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "tessera-lib.selectorLabels" $ | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "tessera-lib.labels" $ | nindent 8 }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with merge (dict) (.podAnnotations | default dict) ($v.podAnnotations | default dict) }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ $sa }}
      automountServiceAccountToken: {{ $kubeApi }}
      {{- with .pod }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with $v.global.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
      securityContext:
        {{- include "tessera-lib.podSecurityContext" (dict "uid" $v.global.image.uid) | nindent 8 }}
      containers:
        - name: {{ $.Chart.Name }}
          image: {{ include "tessera-lib.image" $ }}
          imagePullPolicy: {{ $v.global.image.pullPolicy }}
          command: ["python", "-m", "tessera.{{ $.Chart.Name }}"]
          ports:
            - name: http
              containerPort: {{ $v.port }}
              protocol: TCP
            {{- with .ports }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          env:
            {{- include "tessera-lib.sharedEnv" $ | nindent 12 }}
            - name: {{ $prefix }}HTTP_HOST
              value: "0.0.0.0"
            - name: {{ $prefix }}HTTP_PORT
              value: {{ $v.port | quote }}
            - name: {{ $prefix }}LOG_LEVEL
              value: {{ $v.logLevel | default $v.global.logLevel | quote }}
            {{- if $kubeApi }}
            - name: {{ $prefix }}KUBECONFIG
              value: /etc/tessera/kube/kubeconfig
            {{- end }}
            {{- with .env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- if and .asksAdmission (not $v.settings.admission_url) }}
            - name: {{ $prefix }}ADMISSION_URL
              value: {{ printf "http://%s:8080" (include "tessera-lib.shared" (dict "root" $ "suffix" "admission")) | quote }}
            {{- end }}
            {{- include "tessera-lib.settingsEnv" (dict "prefix" $prefix "settings" $v.settings) | nindent 12 }}
          startupProbe:
            httpGet:
              path: /healthz
              port: http
            {{- toYaml $v.probes.startup | nindent 12 }}
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
            {{- toYaml $v.probes.readiness | nindent 12 }}
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
            {{- toYaml $v.probes.liveness | nindent 12 }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          securityContext:
            {{- include "tessera-lib.containerSecurityContext" $ | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if $kubeApi }}
            - name: kubeconfig
              mountPath: /etc/tessera/kube
              readOnly: true
            {{- end }}
            {{- with .volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir:
            sizeLimit: 64Mi
        {{- if $kubeApi }}
        - name: kubeconfig
          configMap:
            name: {{ include "tessera-lib.shared" (dict "root" $ "suffix" "kubeconfig") }}
        {{- end }}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "tessera-lib.labels" $ | nindent 4 }}
spec:
  type: {{ $v.service.type }}
  {{- if eq .kind "DaemonSet" }}
  clusterIP: None
  {{- end }}
  selector:
    {{- include "tessera-lib.selectorLabels" $ | nindent 4 }}
  ports:
    - name: http
      port: {{ $v.port }}
      targetPort: http
      protocol: TCP
    {{- with .servicePorts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- if and (eq .kind "Deployment") $v.podDisruptionBudget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  labels:
    {{- include "tessera-lib.labels" $ | nindent 4 }}
spec:
  maxUnavailable: {{ $v.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "tessera-lib.selectorLabels" $ | nindent 6 }}
{{- end }}
{{- end -}}


{{/* One ClusterRole or Role and its binding to the service's ServiceAccount:
(dict "ctx" $ "sa" SA "kind" "ClusterRole"|"Role" "name" NAME "namespace" NS "rules" RULES) */}}
{{- define "tessera-lib.role" }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}
metadata:
  name: {{ .name }}
  {{- if eq .kind "Role" }}
  namespace: {{ .namespace }}
  {{- end }}
  labels:
    {{- include "tessera-lib.labels" .ctx | nindent 4 }}
rules:
  {{- toYaml .rules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}Binding
metadata:
  name: {{ .name }}
  {{- if eq .kind "Role" }}
  namespace: {{ .namespace }}
  {{- end }}
  labels:
    {{- include "tessera-lib.labels" .ctx | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ .kind }}
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ .sa }}
    namespace: {{ .ctx.Release.Namespace }}
{{- end -}}

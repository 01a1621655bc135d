{{/*
One evaluation store: a headless Service and a single-replica StatefulSet with a volume for its data.
(dict "root" $ "component" "nats" "values" .Values.evaluation.nats "uid" 1000 "dataPath" "/data"
      "container" (dict ...fields of the container...) "volumes" (list ...))
*/}}
{{- define "tessera.evaluationStore" -}}
{{- $root := .root -}}
{{- $name := include "tessera-lib.shared" (dict "root" $root "suffix" .component) -}}
{{- $labels := dict "root" $root "component" .component -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "tessera-lib.labelsFor" $labels | nindent 4 }}
spec:
  clusterIP: None
  selector:
    {{- include "tessera-lib.selectorLabelsFor" $labels | nindent 4 }}
  ports:
    {{- range .container.ports }}
    - name: {{ .name }}
      port: {{ .containerPort }}
      targetPort: {{ .name }}
    {{- end }}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $name }}
  labels:
    {{- include "tessera-lib.labelsFor" $labels | nindent 4 }}
spec:
  serviceName: {{ $name }}
  replicas: 1
  selector:
    matchLabels:
      {{- include "tessera-lib.selectorLabelsFor" $labels | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "tessera-lib.labelsFor" $labels | nindent 8 }}
    spec:
      automountServiceAccountToken: false
      securityContext:
        {{- include "tessera-lib.podSecurityContext" (dict "uid" .uid) | nindent 8 }}
      containers:
        - name: {{ .component }}
          image: {{ .values.image }}
          {{- toYaml .container | nindent 10 }}
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          securityContext:
            {{- include "tessera-lib.containerSecurityContext" . | nindent 12 }}
          volumeMounts:
            - name: data
              mountPath: {{ .dataPath }}
            {{- range .volumes }}
            - name: {{ .name }}
              mountPath: {{ .mountPath }}
              {{- if .secret }}
              readOnly: true
              {{- end }}
            {{- end }}
      {{- with .volumes }}
      volumes:
        {{- range . }}
        - name: {{ .name }}
          {{- if .secret }}
          secret:
            secretName: {{ .secret }}
            items:
              - key: {{ .key }}
                path: {{ .key }}
          {{- else }}
          emptyDir: {}
          {{- end }}
        {{- end }}
      {{- end }}
  volumeClaimTemplates:
    - metadata:
        name: data
      spec:
        accessModes: ["ReadWriteOnce"]
        {{- with $root.Values.evaluation.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ .values.storage }}
{{- end -}}

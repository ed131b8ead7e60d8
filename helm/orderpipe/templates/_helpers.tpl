{{/* Names and labels shared by every object of the chart. */}}
{{- define "orderpipe.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orderpipe.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one role: "orderpipe.selector" (list . "relay") */}}
{{- define "orderpipe.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "orderpipe.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* A DNS-safe name for a consumer group's objects. */}}
{{- define "orderpipe.groupName" -}}
{{- regexReplaceAll "[^a-z0-9-]" (lower .) "-" | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The container environment: config file, secrets by reference only. */}}
{{- define "orderpipe.env" -}}
- name: ORDERPIPE_CONFIG
  value: /etc/orderpipe/orderpipe.json
- name: ORDERPIPE_DATABASE__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.existingSecret }}
      key: {{ .Values.secretKeys.databaseUrl }}
{{- if .Values.secretKeys.saslPassword }}
- name: ORDERPIPE_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.existingSecret }}
      key: {{ .Values.secretKeys.saslPassword }}
{{- end }}
- name: HOSTNAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end -}}

{{/* Pod spec parts every role shares: "orderpipe.podCommon" . */}}
{{- define "orderpipe.volumes" -}}
volumes:
  - name: config
    configMap:
      name: {{ include "orderpipe.fullname" . }}
  - name: tmp
    emptyDir: {}
{{- end -}}

{{- define "orderpipe.mounts" -}}
volumeMounts:
  - name: config
    mountPath: /etc/orderpipe
    readOnly: true
  - name: tmp
    mountPath: /tmp
{{- end -}}

{{- define "orderpipe.probes" -}}
ports:
  - name: http
    containerPort: {{ .Values.httpPort }}
livenessProbe:
  httpGet: {path: /health/live, port: http}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /health/ready, port: http}
  periodSeconds: 5
  failureThreshold: 3
{{- end -}}

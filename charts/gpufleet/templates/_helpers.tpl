{{- define "gpufleet.name" -}}gpufleet{{- end -}}

{{- define "gpufleet.labels" -}}
app.kubernetes.io/name: gpufleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpufleet.selector" -}}
app.kubernetes.io/name: gpufleet
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpufleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpufleet.webhookService" -}}{{ .Release.Name }}-webhook{{- end -}}

{{/* A SQLite ledger lives on one ReadWriteOnce volume: one replica then (PostgreSQL keeps
     controller.replicas). */}}
{{- define "gpufleet.controllerReplicas" -}}
{{- if eq .Values.ledger.mode "sqlite" -}}1{{- else -}}{{ .Values.controller.replicas }}{{- end -}}
{{- end -}}

{{- define "wfs.name" -}}workflow-streams{{- end -}}

{{- define "wfs.fullname" -}}
{{- if contains "workflow-streams" .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-workflow-streams" .Release.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "wfs.labels" -}}
app.kubernetes.io/name: {{ include "wfs.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "wfs.selector" -}}
app.kubernetes.io/name: {{ include "wfs.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "wfs.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag }}{{- end -}}

{{/* environment shared by every component */}}
{{- define "wfs.env" -}}
- name: WFS_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ .Values.postgres.existingSecret }}, key: {{ .Values.postgres.key }}}
- name: WFS_DATABASE_POOLER
  value: {{ .Values.postgres.pooler | quote }}
- name: WFS_DATABASE_TIMEOUT_SECONDS
  value: {{ .Values.postgres.timeoutSeconds | quote }}
{{- if .Values.postgres.listenKey }}
- name: WFS_LISTEN_DATABASE_URL
  valueFrom:
    secretKeyRef: {name: {{ .Values.postgres.existingSecret }}, key: {{ .Values.postgres.listenKey }}}
{{- end }}
- name: WFS_REGION
  value: {{ .Values.region | quote }}
{{- if .Values.metadataRegion }}
- name: WFS_METADATA_REGION
  value: {{ .Values.metadataRegion | quote }}
{{- end }}
- name: WFS_REGION_CIDRS
  value: {{ .Values.regionCidrs | toJson | quote }}
{{- if .Values.objectStore.existingSecret }}
- name: WFS_S3_REGIONS
  valueFrom:
    secretKeyRef: {name: {{ .Values.objectStore.existingSecret }}, key: {{ .Values.objectStore.key }}}
{{- end }}
{{- end -}}

{{/* pod metadata shared by every component: labels, then podLabels; podAnnotations (the component's win) */}}
{{- define "wfs.podMetadata" -}}
{{- $values := index .root.Values .component -}}
labels:
  {{- include "wfs.labels" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with merge (deepCopy ($values.podAnnotations | default dict)) (.root.Values.podAnnotations | default dict) }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* pull secrets and scheduling: the component's nodeSelector/tolerations/affinity, else the chart-wide ones */}}
{{- define "wfs.podScheduling" -}}
{{- $values := index .root.Values .component -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.nodeSelector | default .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations | default .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity | default .root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

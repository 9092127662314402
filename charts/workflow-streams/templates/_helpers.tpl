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
{{- if .Values.pinsTemplates }}
- name: WFS_PINS_TEMPLATES
  value: {{ .Values.pinsTemplates | toJson | quote }}
{{- end }}
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

{{/* Whether this release may manage the cluster-wide object (apiVersion, kind, name): it does not exist
yet, or this release made it. One that something else made (CRDs applied with `kubectl apply -f crds/` as
the project README says, another release's) is left as it is: helm would refuse to install over it
("exists and cannot be imported into the current release"). Offline (helm template, --dry-run) `lookup`
finds nothing, so everything renders. Prints "true" or nothing. */}}
{{- define "wfs.ours" -}}
{{- $found := lookup .apiVersion .kind "" .name -}}
{{- if not $found -}}true
{{- else -}}
{{- $annotations := $found.metadata.annotations | default dict -}}
{{- if and (eq (get $annotations "meta.helm.sh/release-name") .root.Release.Name) (eq (get $annotations "meta.helm.sh/release-namespace") .root.Release.Namespace) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* The CRDs this release installs, as a list of YAML documents: with crds.create, those of files/crds/
that are not someone else's (see wfs.ours). */}}
{{- define "wfs.crdDocuments" -}}
{{- $docs := list -}}
{{- if .Values.crds.create -}}
{{- range $path, $_ := .Files.Glob "files/crds/*.yaml" -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" ($.Files.Get $path) -1 -}}
{{- $crd := fromYaml $doc -}}
{{- if and $crd.metadata (include "wfs.ours" (dict "root" $ "apiVersion" "apiextensions.k8s.io/v1" "kind" "CustomResourceDefinition" "name" $crd.metadata.name)) -}}
{{- $docs = append $docs (trim $doc) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}

{{/* Chart name, overridable. */}}
{{- define "patchbay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name when it already contains the chart name
(`helm install patchbay charts/patchbay` gives `patchbay`), otherwise
`<release>-<chart>`. Kept to 54 characters so that "-operator" fits in 63.
*/}}
{{- define "patchbay.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the operator's Deployment, Service, ClusterRole and Lease. */}}
{{- define "patchbay.operatorName" -}}
{{- printf "%s-operator" (include "patchbay.fullname" .) }}
{{- end }}

{{- define "patchbay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "patchbay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "patchbay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "patchbay.labels" -}}
helm.sh/chart: {{ include "patchbay.chart" . }}
{{ include "patchbay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: patchbay
{{- end }}

{{- define "patchbay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "patchbay.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "patchbay.leaseName" -}}
{{- default (include "patchbay.operatorName" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}: by digest when one is
given, otherwise by tag, the tag defaulting to the chart's appVersion.
Call with (dict "image" <values> "context" $).
*/}}
{{- define "patchbay.image" -}}
{{- $image := .image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .context.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* Chart name, overridable. */}}
{{- define "patchbay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name when it already contains the chart name
(`helm install patchbay charts/patchbay` gives `patchbay`), otherwise
`<release>-<chart>`; at most 63 characters. It is only ever used with a
suffix, through "patchbay.suffixed".
*/}}
{{- define "patchbay.fullname" -}}
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

{{/*
The full name with a suffix, in at most 63 characters: the full name is cut
so that the suffix fits whole. Every object name the chart makes is one of
these, so each fits a DNS label (a Service's name must) whatever the release
name. Call with (dict "context" $ "suffix" "-operator-metrics").
*/}}
{{- define "patchbay.suffixed" -}}
{{- $room := int (sub 63 (len .suffix)) }}
{{- printf "%s%s" (include "patchbay.fullname" .context | trunc $room | trimSuffix "-") .suffix }}
{{- end }}

{{/* Name of the operator's Deployment, ClusterRole, ServiceAccount and Lease. */}}
{{- define "patchbay.operatorName" -}}
{{- include "patchbay.suffixed" (dict "context" . "suffix" "-operator") }}
{{- end }}

{{- define "patchbay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "patchbay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "patchbay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The labels of the operator's objects. */}}
{{- define "patchbay.labels" -}}
{{ include "patchbay.componentLabels" (dict "context" . "component" "operator") }}
{{- end }}

{{/*
The chart's labels for an object of one component: `operator` (the operator's
Deployment, Service, RBAC, …) or `gateway` (what the chart makes for the
gateways, such as their ServiceMonitor). Call with
(dict "context" $ "component" "gateway").
*/}}
{{- define "patchbay.componentLabels" -}}
helm.sh/chart: {{ include "patchbay.chart" .context }}
app.kubernetes.io/name: {{ include "patchbay.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/version: {{ .context.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
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

{{/*
"true" when the cluster serves the Prometheus Operator's API
(monitoring.coreos.com/v1), else empty: the PrometheusRule needs it. The one
place the chart asks (`helm template` asks with `--api-versions`).
*/}}
{{- define "patchbay.prometheusOperatorServed" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

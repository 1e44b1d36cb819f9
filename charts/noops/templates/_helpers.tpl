{{/*
Names from the release: with the release called "noops" (the README's install) every object
has the name deploy/ gives it; another release, or fullnameOverride, gets names of its own, so
two releases never share a cluster-scoped object, a selector or a leader Lease.
*/}}
{{- define "noops.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 46 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 46 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The operator's Deployment, its pods' label, its ClusterRole and its leader Lease. */}}
{{- define "noops.operator" -}}
{{- printf "%s-operator" (include "noops.fullname" .) -}}
{{- end -}}

{{/* The label that selects the operator's pods. */}}
{{- define "noops.selector" -}}
app.kubernetes.io/name: {{ include "noops.operator" . }}
{{- end -}}

{{/* The names of imagePullSecrets, comma separated. */}}
{{- define "noops.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}{{- $names = append $names .name -}}{{- end -}}
{{- join "," $names -}}
{{- end -}}

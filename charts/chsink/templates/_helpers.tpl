{{- define "chsink.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Names every namespaced object of the release. */}}
{{- define "chsink.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else -}}{{- $name := include "chsink.name" . -}}
{{- if contains $name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- end -}}

{{/* Names a cluster-scoped object (ClusterRoles and their bindings): the release's namespace is part of it, so
two releases named alike in two namespaces do not collide. */}}
{{- define "chsink.clusterName" -}}
{{ include "chsink.fullname" . }}-{{ .Release.Namespace }}
{{- end -}}

{{- define "chsink.labels" -}}
app.kubernetes.io/name: {{ include "chsink.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "chsink.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chsink.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "chsink.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "chsink.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}

{{/* Namespaces that hold sinks: the watched ones, or the release namespace for a cluster-wide install. */}}
{{- define "chsink.sinkNamespaces" -}}
{{- if .Values.watchNamespaces -}}{{ join "," .Values.watchNamespaces }}{{- else -}}{{ .Release.Namespace }}{{- end -}}
{{- end -}}

{{/* The Spark driver's ClusterRole of a cluster-wide install (the operator binds it in each sink's namespace). */}}
{{- define "chsink.sparkDriverRole" -}}
{{ include "chsink.clusterName" . }}-spark-driver
{{- end -}}

{{/* What a Spark driver does: create and delete its executor pods, their headless service and config. */}}
{{- define "chsink.sparkDriverRules" -}}
- apiGroups: [""]
  resources: [pods, services, configmaps, persistentvolumeclaims]
  verbs: [get, list, watch, create, delete, deletecollection]
{{- end -}}

{{/* The operator's rules, shared by the ClusterRole (cluster-wide) and the per-namespace Roles. */}}
{{- define "chsink.operatorRules" -}}
# its own resources: watched by kopf, patched for finalizers and kopf's progress annotations
- apiGroups: [chsink.io]
  resources: [clickhousesinks]
  verbs: [get, list, watch, patch, update]
- apiGroups: [chsink.io]
  resources: [clickhousesinks/status]
  verbs: [get, patch, update]
# the SinkStatus it publishes (kubectl get sinkstatus)
- apiGroups: [chsink.io]
  resources: [sinkstatuses]
  verbs: [get, create, patch]
# the SparkApplication it renders per sink: replaced whole when its spec changes, deleted on stop and by the finalizer
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications]
  verbs: [get, create, update, delete]
# the ConfigMap holding each job's config
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
# the job's pods, read only: a sink is Paused, Stopped or drained only once none is left
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
# a deleted sink's remote checkpoint (s3a://, hdfs://) is deleted by a Job with the driver's credentials
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create, delete]
# kopf posts handler progress and sink lifecycle as Events
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
# credentials named by sinks, to reach the state store and Kafka for cleanup and status
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
  {{- with .Values.rbac.secretNames }}
  resourceNames: {{ toJson . }}
  {{- end }}
{{- end -}}

{{/* kopf watches namespaces (to follow --namespace) and CRDs (resources appearing at runtime). */}}
{{- define "chsink.discoveryRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
# the SparkApplication CRD's schema tells whether the spark-operator is too old for spec.suspend
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  resourceNames: [sparkapplications.sparkoperator.k8s.io]
  verbs: [get]
{{- end -}}

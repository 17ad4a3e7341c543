{{/* Names, labels and the RBAC rules shared by the templates. */}}

{{- define "tinct.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tinct.fullname" -}}
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

{{- define "tinct.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tinct.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tinct
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "router"). */}}
{{- define "tinct.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tinct.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "tinct.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "tinct.operator.serviceAccountName" -}}
{{- default (printf "%s-operator" (include "tinct.fullname" .)) .Values.operator.serviceAccount.name }}
{{- end }}

{{- define "tinct.router.serviceAccountName" -}}
{{- default (printf "%s-router" (include "tinct.fullname" .)) .Values.router.serviceAccount.name }}
{{- end }}

{{/* The namespaces watched in scope=namespaced, as a JSON list (fromJsonArray to use). */}}
{{- define "tinct.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson .Values.watchNamespaces }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{- define "tinct.clusterScope" -}}
{{- if eq .Values.scope "cluster" }}true{{- end }}
{{- end }}

{{/*
The operator's rules, exact verbs only. Include with (dict "cluster" true|false): the
cluster-scoped resources (CRDs, namespaces, ClusterKopfPeering) appear only in the
ClusterRole of scope=cluster; a Role cannot grant them.
*/}}
{{- define "tinct.operator.rules" -}}
# framework: kopf posts Events about handler progress and errors (core/v1 Events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .cluster }}
# framework: leader election among replicas; the operator creates its peering object when missing.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch, create]
{{ include "tinct.operator.discoveryRules" . }}
{{- else }}
# framework: leader election among replicas; the operator creates its peering object when missing.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch, create]
{{- end }}
# application: the two custom resources; kopf patches finalizers, annotations and status.
- apiGroups: [tinct.io]
  resources: [modelversions, grayreleases]
  verbs: [get, list, watch, patch]
- apiGroups: [tinct.io]
  resources: [modelversions/status]
  verbs: [get, patch]
# application: a GrayRelease's status is written whole, sealed (a status stored exactly as signed).
- apiGroups: [tinct.io]
  resources: [grayreleases/status]
  verbs: [get, update]
# application: owner references with blockOwnerDeletion on the children of a GrayRelease.
- apiGroups: [tinct.io]
  resources: [modelversions/finalizers, grayreleases/finalizers]
  verbs: [update]
# application: one HorizontalPodAutoscaler per backend of a GrayRelease (server-side apply); deleted when KEDA scales it instead.
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, patch, delete]
{{- if .keda }}
# application: with spec.autoscaling.keda, one KEDA ScaledObject per backend instead (server-side apply); deleted when HPAs scale it again.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}
# application: the stable and candidate backends a GrayRelease names are read, never changed.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch]
# application: the pods behind stable's Service, each of which a LoRA adapter candidate is loaded into.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch]
{{- end }}

{{/*
The operator's rules in its own namespace, where the routing tables live: only it writes
them (a tenant's ConfigMaps elsewhere never route), and it deletes the standing route of a
deleted release once another release serves its models.
*/}}
{{- define "tinct.operator.tableRules" -}}
# application: routing tables, written with server-side apply, in this namespace only.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
{{- end }}

{{/*
Read-only cluster metadata kopf scans at start and follows: CRDs (what it can serve) and
namespaces (which exist). A ClusterRole even in scope=namespaced unless
rbac.clusterDiscovery is off; without it kopf retries, warns and falls back, which delays
its start by about a minute.
*/}}
{{- define "tinct.operator.discoveryRules" -}}
# framework: kopf follows CRDs being added and removed to know what it can serve.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
# framework: kopf follows namespaces coming and going.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}

{{/* The router's rules, in the chart's namespace only: it reads the routing tables there and reports bad ones. */}}
{{- define "tinct.router.rules" -}}
# application: follow the routing-table ConfigMaps the operator writes (this namespace only).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
# application: a Warning Event on a ConfigMap holding an invalid routing table.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/*
The tenants' rules on tinct's resources, aggregated into the built-in view and edit/admin
ClusterRoles. No /status: the status of a release is the operator's sealed record.
*/}}
{{- define "tinct.tenant.viewRules" -}}
# application: read ModelVersions and GrayReleases (their status included, as a get returns it).
- apiGroups: [tinct.io]
  resources: [modelversions, grayreleases]
  verbs: [get, list, watch]
{{- end }}

{{- define "tinct.tenant.editRules" -}}
# application: create, change and delete ModelVersions and GrayReleases (tinct.io/action included); never /status.
- apiGroups: [tinct.io]
  resources: [modelversions, grayreleases]
  verbs: [create, update, patch, delete, deletecollection]
{{- end }}

{{/*
One Role or ClusterRole with its binding to a ServiceAccount. Include with
(dict "ctx" $ "kind" "Role"|"ClusterRole" "name" NAME "namespace" NS "rules" RULES "sa" SA).
*/}}
{{- define "tinct.role" }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}
metadata:
  name: {{ .name }}
  {{- if eq .kind "Role" }}
  namespace: {{ .namespace }}
  {{- end }}
  labels:
    {{- include "tinct.labels" .ctx | nindent 4 }}
rules:
{{- .rules | nindent 0 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}Binding
metadata:
  name: {{ .name }}
  {{- if eq .kind "Role" }}
  namespace: {{ .namespace }}
  {{- end }}
  labels:
    {{- include "tinct.labels" .ctx | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ .kind }}
  name: {{ .name }}
subjects:
- kind: ServiceAccount
  name: {{ .sa }}
  namespace: {{ .ctx.Release.Namespace }}
{{- end }}

{{/*
Worker processes per router Pod: router.workers, else the CPU limit rounded up (empty
without a limit: `tinct router` then reads the container's CPU quota itself).
*/}}
{{- define "tinct.router.workers" -}}
{{- $r := .Values.router }}
{{- if $r.workers }}
{{- $r.workers }}
{{- else }}
{{- $cpu := toString ((($r.resources).limits).cpu | default "") }}
{{- if hasSuffix "m" $cpu }}
{{- max 1 (ceil (divf (float64 (trimSuffix "m" $cpu)) 1000) | int) }}
{{- else if $cpu }}
{{- max 1 (ceil (float64 $cpu) | int) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the token routers send the comparer: the given one, or the chart's. */}}
{{- define "tinct.comparer.tokenSecret" -}}
{{- .Values.comparer.tokenSecret.name | default (printf "%s-comparer-token" (include "tinct.fullname" .)) -}}
{{- end }}

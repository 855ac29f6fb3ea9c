{{/* The operator's name: its ServiceAccount's, Deployment's, Service's and RBAC's. The release
`perennial` gives deploy/operator's `perennial-operator`; another release, its own names. */}}
{{- define "perennial.operator" -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "perennial.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* On every object: deploy/'s label, and Helm's. */}}
{{- define "perennial.labels" -}}
app.kubernetes.io/part-of: perennial
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The operator's pods: deploy/'s name label, and this release's. */}}
{{- define "perennial.operatorSelector" -}}
app.kubernetes.io/name: perennial-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "perennial.edgeSelector" -}}
app.kubernetes.io/name: perennial-edge
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The edge agents' namespace: the operator's default (PERENNIAL_EDGE_NAMESPACE, and the
namespace of PERENNIAL_LINK_TOKENS). */}}
{{- define "perennial.edgeNamespace" -}}perennial-edge{{- end -}}

{{/* The operator's ServiceAccount as a binding's subject. */}}
{{- define "perennial.subject" -}}
- kind: ServiceAccount
  name: {{ include "perennial.operator" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* What the operator calls on the jobs, in every namespace (the ClusterRole) or in each watched
one (its Role): deploy/operator/cluster-rbac.yaml's rules, deploy/operator-namespaced/watched's.
README's table says what each grant is for; tests/cluster/rbac.rs proves each is used. */}}
{{- define "perennial.jobRules" -}}
# The jobs: watched; read again on a status conflict; the finalizer patched on and off.
- apiGroups: [sedna.io]
  resources: [lifelonglearningjobs]
  verbs: [get, list, watch, patch]
# Their status: a merge patch (never read alone: the watch has it).
- apiGroups: [sedna.io]
  resources: [lifelonglearningjobs/status]
  verbs: [patch]
# Worker pods owned by a job with blockOwnerDeletion need update on the owner's finalizers
# (the OwnerReferencesPermissionEnforcement admission plugin checks it at each pod creation).
- apiGroups: [sedna.io]
  resources: [lifelonglearningjobs/finalizers]
  verbs: [update]
# The jobs' Datasets: watched; their sample counts written to their status.
- apiGroups: [sedna.io]
  resources: [datasets]
  verbs: [list, watch]
- apiGroups: [sedna.io]
  resources: [datasets/status]
  verbs: [patch]
# The train, eval and inference workers: watched by label, created, and deleted by label (by
# name, one at a time, in a namespace of over 1,000 worker pods).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete, deletecollection]
# Events on the jobs (events.k8s.io; a repeated event is patched into a series).
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{/* The edge agents' projected tokens, reviewed when they open the link: cluster wide in both
installs (TokenReviews are not in a namespace). */}}
{{- define "perennial.reviewRules" -}}
# The edge agents' projected tokens, reviewed when they open the link.
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
{{- end -}}

{{/* The values checked once, for every template. */}}
{{- define "perennial.checked" -}}
{{- if and .Values.rbac.namespaced (not .Values.watchNamespaces) -}}
{{- fail "rbac.namespaced=true needs watchNamespaces: the namespaces the operator watches" -}}
{{- end -}}
{{- if and (not .Values.rbac.namespaced) .Values.watchNamespaces -}}
{{- fail "watchNamespaces is for rbac.namespaced=true (the cluster-wide install watches every namespace)" -}}
{{- end -}}
{{- end -}}

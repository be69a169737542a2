{{- define "clustermap.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "clustermap.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/part-of: clustermap
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "clustermap.selector" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{- define "clustermap.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "clustermap.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "clustermap.fullname" .) }}
{{- else -}}
{{ required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{/* controller: whether any controller mode is on. */}}
{{- define "clustermap.controller" -}}
{{- if or .Values.mcs.enabled .Values.cloudmapDNS.enabled .Values.syndicate.enabled -}}true{{- end -}}
{{- end -}}

{{/* cloudMap: whether a mode reaches Cloud Map (mcs over Cloud Map, or
cloudmapDNS). */}}
{{- define "clustermap.cloudMap" -}}
{{- if or (and .Values.mcs.enabled (or (ne (include "clustermap.registry" .) "hub") (eq (.Values.mcs.migratingFrom | default "") "cloudmap"))) .Values.cloudmapDNS.enabled }}true{{ end }}
{{- end }}

{{/* registry: the MCS registry, cloudmap unless mcs.registry says hub
(values of an older chart, kept by --reuse-values, have none). */}}
{{- define "clustermap.registry" -}}
{{- .Values.mcs.registry | default "cloudmap" -}}
{{- end -}}

{{/* hubRead: the MCS mode reads a hub, as its registry or the one the
clusterset moves from. */}}
{{- define "clustermap.hubRead" -}}
{{- if and .Values.mcs.enabled (or (eq (include "clustermap.registry" .) "hub") (eq (.Values.mcs.migratingFrom | default "") "hub")) }}true{{ end }}
{{- end -}}

{{/* Restricted PodSecurity: what every container runs with. */}}
{{- define "clustermap.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* PDB: one replica out at a time, an unready one always (a drain never
waits forever). */}}
{{- define "clustermap.pdbSpec" -}}
maxUnavailable: {{ .Values.podDisruptionBudget.maxUnavailable }}
unhealthyPodEvictionPolicy: AlwaysAllow
{{- end -}}

{{/* A ServiceMonitor for the metrics Service of app (name-metrics). */}}
{{- define "clustermap.serviceMonitor" -}}
{{- if .root.Values.serviceMonitor.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "clustermap.labels" .root | nindent 4 }}
    {{- with .root.Values.serviceMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "clustermap.selector" (dict "name" .app "root" .root) | nindent 6 }}
  endpoints:
  - port: metrics
    interval: {{ .root.Values.serviceMonitor.interval }}
    {{- if .root.Values.metricsSecure }}
    # Prometheus's own token, which the API server reviews; the serving
    # certificate is self-signed.
    scheme: https
    bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
    tlsConfig:
      insecureSkipVerify: true
    {{- end }}
    {{- with .root.Values.serviceMonitor.cluster | default .root.Values.clusterProperties.clusterId }}
    relabelings:
    - action: replace
      targetLabel: cluster
      replacement: {{ . | quote }}
    {{- end }}
{{- end }}
{{- end -}}

{{/* egress: the cluster's DNS, HTTPS to anywhere (API servers on 443 or
6443, Cloud Map and STS endpoints, syndicate peers), and what
networkPolicy.extraEgress adds. */}}
{{- define "clustermap.egress" -}}
- ports:
  - {port: 53, protocol: UDP}
  - {port: 53, protocol: TCP}
- ports:
  - {port: 443, protocol: TCP}
  - {port: 6443, protocol: TCP}
# AWS credentials on the node: the EKS Pod Identity agent and the
# instance metadata service (node role, Region), over plain HTTP.
- to:
  - ipBlock: {cidr: 169.254.170.23/32}
  - ipBlock: {cidr: fd00:ec2::23/128}
  - ipBlock: {cidr: 169.254.169.254/32}
  - ipBlock: {cidr: fd00:ec2::254/128}
  ports:
  - {port: 80, protocol: TCP}
{{- with .Values.networkPolicy.extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end -}}

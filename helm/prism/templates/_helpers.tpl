{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "prism.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart, unless the release name already holds the chart name. */}}
{{- define "prism.fullname" -}}
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

{{- define "prism.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels on every object. */}}
{{- define "prism.labels" -}}
helm.sh/chart: {{ include "prism.chart" . }}
{{ include "prism.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prism
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels: stable across upgrades. */}}
{{- define "prism.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prism.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "prism.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "prism.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "prism.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The ConfigMap holding the topology CSV: ours, or the user's. */}}
{{- define "prism.topologyConfigMap" -}}
{{- default (printf "%s-topology" (include "prism.fullname" .)) .Values.topology.existingConfigMap }}
{{- end }}

{{/* The ConfigMap holding the job-names inventory: the user's, or ours when jobNames.csv is set; empty for none. */}}
{{- define "prism.jobNamesConfigMap" -}}
{{- if .Values.jobNames.existingConfigMap }}
{{- .Values.jobNames.existingConfigMap }}
{{- else if .Values.jobNames.csv }}
{{- printf "%s-job-names" (include "prism.fullname" .) }}
{{- end }}
{{- end }}

{{/* Image by digest when given (repository[:tag]@sha256:...), else by tag. */}}
{{- define "prism.imageRef" -}}
{{- if .Values.image.digest }}
{{- if .Values.image.tag }}
{{- printf "%s:%s@%s" .Values.image.repository .Values.image.tag .Values.image.digest }}
{{- else }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- end }}
{{- else }}
{{- include "prism.image" . }}
{{- end }}
{{- end }}

{{/* Kafka connection-security flags, shared by the daemon and the collectors. */}}
{{- define "prism.kafkaArgs" -}}
{{- $k := .Values.kafka }}
{{- if ne $k.securityProtocol "PLAINTEXT" }}
- --kafka.security-protocol={{ $k.securityProtocol }}
{{- end }}
{{- if $k.tls.existingSecret }}
- --kafka.tls.ca-file=/etc/prism/kafka-tls/ca.crt
{{- if $k.tls.clientCertificate }}
- --kafka.tls.cert-file=/etc/prism/kafka-tls/tls.crt
- --kafka.tls.key-file=/etc/prism/kafka-tls/tls.key
{{- end }}
{{- end }}
{{- if hasPrefix "SASL_" $k.securityProtocol }}
- --kafka.sasl.mechanism={{ $k.sasl.mechanism }}
- --kafka.sasl.username={{ required "kafka.sasl.username is required with a SASL securityProtocol" $k.sasl.username }}
{{- end }}
{{- end }}

{{/* The SASL password: an environment variable from the Secret, never an argument. */}}
{{- define "prism.kafkaEnv" -}}
{{- $k := .Values.kafka }}
{{- if hasPrefix "SASL_" $k.securityProtocol }}
- name: PRISM_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ required "kafka.sasl.existingSecret is required with a SASL securityProtocol" $k.sasl.existingSecret }}
      key: {{ $k.sasl.passwordKey }}
{{- end }}
{{- end }}

{{- define "prism.kafkaVolumeMounts" -}}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: /etc/prism/kafka-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "prism.kafkaVolumes" -}}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
{{- end }}
{{- end }}

{{/* HTTPS when the web config turns TLS on. */}}
{{- define "prism.webScheme" -}}
{{- if .Values.web.tls }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* numba's compiled-code cache: the environment variable, the mount and the volume (numbaCache.volume) */}}
{{- define "prism.numbaCacheEnv" -}}
# numba caches compiled kernels here (the code's own directory is read-only); kept across pods unless emptyDir
- name: NUMBA_CACHE_DIR
  value: /cache/numba
{{- end }}

{{- define "prism.numbaCacheMount" -}}
- name: numba-cache
  mountPath: /cache/numba
{{- end }}

{{- define "prism.numbaCacheVolume" -}}
- name: numba-cache
{{- if eq .Values.numbaCache.volume "hostPath" }}
  hostPath:
    path: {{ required "numbaCache.hostPath is required with numbaCache.volume=hostPath" .Values.numbaCache.hostPath }}
    type: DirectoryOrCreate
{{- else if eq .Values.numbaCache.volume "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ required "numbaCache.claimName is required with numbaCache.volume=persistentVolumeClaim" .Values.numbaCache.claimName }}
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.numbaCache.sizeLimit }}
{{- end }}
{{- end }}

{{/* The daemon's stages: "daemon" (stages.mode=all: one Deployment, `--role all`), or "ingest" and "analyse" (split). */}}
{{- define "prism.stages" -}}
{{- if eq .Values.stages.mode "split" }}ingest analyse{{ else }}daemon{{ end }}
{{- end }}

{{/* A stage's object names: the full name for the whole daemon, <fullname>-<stage> for a stage (kept within 63 characters). */}}
{{- define "prism.stageName" -}}
{{- if eq .stage "daemon" }}
{{- include "prism.fullname" .root }}
{{- else }}
{{- printf "%s-%s" (include "prism.fullname" .root | trunc (int (sub 62 (len .stage))) | trimSuffix "-") .stage }}
{{- end }}
{{- end }}

{{/* A stage's consumer group and topic, as the daemon derives them (prism/serve/jobtopic.py: analyse_group). */}}
{{- define "prism.stageGroup" -}}
{{- $group := index .root.Values.config "kafka.group-id" | default "prism" }}
{{- if eq .stage "analyse" }}{{ printf "%s-analyse" $group }}{{ else }}{{ $group }}{{ end }}
{{- end }}

{{- define "prism.stageTopic" -}}
{{- if eq .stage "analyse" }}
{{- index .root.Values.config "kafka.job-topic" | default "prism-jobs" }}
{{- else }}
{{- index .root.Values.config "kafka.topic" | default "prism-flows" }}
{{- end }}
{{- end }}

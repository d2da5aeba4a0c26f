{{/* The release's name for objects: "ml-assets" when the release is called ml-assets. */}}
{{- define "ml-assets.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ml-assets.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "ml-assets.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ml-assets.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ml-assets.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ml-assets.image" -}}
{{- printf "%s:%s" (required "image.repository is required (the image built from the Dockerfile)" .Values.image.repository) .Values.image.tag -}}
{{- end -}}

{{- define "ml-assets.mlflowUrl" -}}
{{- if .Values.mlflow.enabled -}}
{{- printf "http://%s-mlflow:%v" (include "ml-assets.fullname" .) .Values.mlflow.port -}}
{{- else -}}
{{- required "mlflow.externalUrl is required when mlflow.enabled is false" .Values.mlflow.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* The environment every ml_assets process reads: settings from the ConfigMap, credentials by reference. */}}
{{- define "ml-assets.envFrom" -}}
- configMapRef:
    name: {{ include "ml-assets.fullname" . }}-env
{{- if .Values.secrets.s3 }}
- secretRef:
    name: {{ .Values.secrets.s3 }}
{{- end }}
- secretRef:
    name: {{ .Values.secrets.lakefs }}
- secretRef:
    name: {{ .Values.secrets.optuna }}
- secretRef:
    name: {{ .Values.secrets.mlflowPlatform }}
{{- end -}}

{{/* The root filesystem is read-only: a process writes only to these. */}}
{{- define "ml-assets.writableVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 4Gi
- name: home
  emptyDir:
    sizeLimit: 4Gi
{{- end -}}

{{- define "ml-assets.writableMounts" -}}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /var/lib/ml_assets
{{- end -}}

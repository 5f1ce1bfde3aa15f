{{/* Names and shared snippets. Cluster-scoped objects carry the fgpu- prefix. */}}
{{- define "fgpu.labels" -}}
app.kubernetes.io/name: fgpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* selector labels of one component: include "fgpu.selector" (list . "controller") */}}
{{- define "fgpu.selector" -}}
app.kubernetes.io/name: fgpu
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "fgpu.componentLabels" -}}
{{ include "fgpu.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* <registry>/<name>:<tag> for one image key of .Values.image */}}
{{- define "fgpu.image" -}}
{{- $ctx := index . 0 -}}
{{- $name := index $ctx.Values.image (index . 1) -}}
{{- $tag := $ctx.Values.image.tag | default $ctx.Chart.AppVersion -}}
{{- if $ctx.Values.image.registry -}}
{{ printf "%s/%s:%s" $ctx.Values.image.registry $name $tag }}
{{- else -}}
{{ printf "%s:%s" $name $tag }}
{{- end -}}
{{- end -}}

{{/* The node image: the fake one in fake-GPU mode */}}
{{- define "fgpu.nodeImage" -}}
{{- if .Values.fakeGpus.enabled -}}
{{ include "fgpu.image" (list . "kubeletPluginFake") }}
{{- else -}}
{{ include "fgpu.image" (list . "kubeletPlugin") }}
{{- end -}}
{{- end -}}

{{/* The mode in force: auto resolves from the cluster's version at render time */}}
{{- define "fgpu.mode" -}}
{{- if ne .Values.mode "auto" -}}
{{ .Values.mode }}
{{- else if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version -}}
capacity
{{- else -}}
controller
{{- end -}}
{{- end -}}

{{/* resource.k8s.io version for DeviceClasses: v1 (1.34+), v1beta2 (1.33), v1beta1 */}}
{{- define "fgpu.draApi" -}}
{{- if .Capabilities.APIVersions.Has "resource.k8s.io/v1/DeviceClass" -}}
resource.k8s.io/v1
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta2/DeviceClass" -}}
resource.k8s.io/v1beta2
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta1/DeviceClass" -}}
resource.k8s.io/v1beta1
{{- else if semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version -}}
resource.k8s.io/v1
{{- else if semverCompare ">=1.33.0-0" .Capabilities.KubeVersion.Version -}}
resource.k8s.io/v1beta2
{{- else -}}
resource.k8s.io/v1beta1
{{- end -}}
{{- end -}}

{{- define "fgpu.sa" -}}
system:serviceaccount:{{ (index . 0).Release.Namespace }}:{{ index . 1 }}
{{- end -}}

{{- define "fgpu.certSecret" -}}fgpu-webhook-tls{{- end -}}

{{/* pod scheduling settings: component values win over the global ones */}}
{{- define "fgpu.scheduling" -}}
{{- $ctx := index . 0 -}}
{{- $c := index . 1 -}}
{{- with ($c.nodeSelector | default $ctx.Values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.tolerations | default $ctx.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.priorityClassName | default $ctx.Values.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with $ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* caBundle / cert-manager injection of a webhook configuration (certs.mode) */}}
{{- define "fgpu.caAnnotations" -}}
{{- if eq .Values.certs.mode "certManager" }}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "fgpu.certSecret" . }}
{{- end }}
{{- end -}}

{{/* The CA bundle the certs Job last wrote (kept across upgrades); empty at first install,
     when the Job sets it. */}}
{{- define "fgpu.caBundle" -}}
{{- if eq .Values.certs.mode "job" -}}
{{- $s := lookup "v1" "Secret" .Release.Namespace (include "fgpu.certSecret" .) -}}
{{- if and $s $s.data (index $s.data "ca-bundle.crt") }}
caBundle: {{ index $s.data "ca-bundle.crt" }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fgpu.excludedNamespaces" -}}
namespaceSelector:
  matchExpressions:
    - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, {{ .Release.Namespace }}]}
{{- end -}}

{{/* The certs subcommand's arguments: every Service the webhooks call, every webhook
     configuration whose caBundle it sets. */}}
{{- define "fgpu.certsArgs" -}}
- certs
- ensure
- --namespace={{ .Release.Namespace }}
- --secret={{ include "fgpu.certSecret" . }}
{{- if .Values.controller.enabled }}
- --dns-name=fgpu-controller.{{ .Release.Namespace }}.svc
- --dns-name=fgpu-controller.{{ .Release.Namespace }}.svc.cluster.local
{{- if eq (include "fgpu.mode" .) "controller" }}
- --mutating-webhook=fgpu-allocation-gate
{{- end }}
{{- if .Values.controller.hamiPods.enabled }}
- --mutating-webhook=fgpu-hami-pods
{{- end }}
- --validating-webhook=fgpu-claim-config
{{- end }}
{{- if .Values.legacy.enabled }}
- --dns-name=fgpu-extender.{{ .Release.Namespace }}.svc
- --dns-name=fgpu-extender.{{ .Release.Namespace }}.svc.cluster.local
- --mutating-webhook=fgpu-legacy-pods
{{- if .Values.legacy.grantWebhook.enabled }}
- --validating-webhook=fgpu-legacy-grant
{{- end }}
{{- end }}
{{- range .Values.certs.extraDnsNames }}
- --dns-name={{ . }}
{{- end }}
- --validity-days={{ .Values.certs.validityDays }}
- --ca-validity-days={{ .Values.certs.caValidityDays }}
- --renew-before-days={{ .Values.certs.renewBeforeDays }}
- --log-format=json
{{- end -}}

{{- define "fgpu.certsPod" -}}
serviceAccountName: fgpu-certs
restartPolicy: OnFailure
{{- include "fgpu.scheduling" (list . .Values.controller) }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
containers:
  - name: certs
    image: {{ include "fgpu.image" (list . "controller") }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args: {{- include "fgpu.certsArgs" . | nindent 6 }}
    resources:
      requests: {cpu: 10m, memory: 16Mi}
      limits: {memory: 64Mi}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      runAsNonRoot: true
      capabilities: {drop: [ALL]}
{{- end -}}

{{- define "fgpu.webhooksEnabled" -}}
{{- if or .Values.controller.enabled .Values.legacy.enabled -}}true{{- end -}}
{{- end -}}

{{/* Every GPU UUID of the fake profile, comma-separated (the fake NVML's device list). */}}
{{- define "fgpu.fakeUuids" -}}
{{- $u := list -}}
{{- range .Values.fakeGpus.profile.nodes -}}
{{- range .gpus -}}
{{- $u = append $u .uuid -}}
{{- end -}}
{{- end -}}
{{- join "," $u -}}
{{- end -}}

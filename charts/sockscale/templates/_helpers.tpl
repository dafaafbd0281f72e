{{/*
Prefix of every object's name: "sockscale" unless fullnameOverride is set.
Not derived from the release name: the agents find the controller as
"<prefix>-controller-stats.<namespace>.svc", and cluster-scoped objects
(ClusterRoles) must not clash with a second release's anyway.
*/}}
{{- define "sockscale.fullname" -}}
{{- .Values.fullnameOverride | default "sockscale" | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "sockscale.agent.fullname" -}}
{{- printf "%s-agent" (include "sockscale.fullname" .) -}}
{{- end -}}

{{- define "sockscale.controller.fullname" -}}
{{- printf "%s-controller" (include "sockscale.fullname" .) -}}
{{- end -}}

{{- define "sockscale.activator.fullname" -}}
{{- printf "%s-activator" (include "sockscale.fullname" .) -}}
{{- end -}}

{{/* The headless Service every controller replica is behind. */}}
{{- define "sockscale.controller.statsService" -}}
{{- printf "%s-controller-stats" (include "sockscale.fullname" .) -}}
{{- end -}}

{{/*
host:port where agents and activators POST their stats: the headless stats
Service, so that each report reaches every controller replica.
*/}}
{{- define "sockscale.controller.statsAddress" -}}
{{- printf "%s.%s.svc:%d" (include "sockscale.controller.statsService" .) .Release.Namespace (int .Values.controller.ports.stats) -}}
{{- end -}}

{{/* The autoscaler ConfigMap's name; the controller reads <ns>/<this>. */}}
{{- define "sockscale.autoscalerConfigMap" -}}
{{- printf "%s-autoscaler" (include "sockscale.fullname" .) -}}
{{- end -}}

{{- define "sockscale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Labels of every object. Call with (dict "ctx" $ "component" "agent").
*/}}
{{- define "sockscale.labels" -}}
helm.sh/chart: {{ include "sockscale.chart" .ctx }}
{{ include "sockscale.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: sockscale
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Selector labels: immutable in a DaemonSet's and a Deployment's selector, so
they never include the version. Call with (dict "ctx" $ "component" "agent").
*/}}
{{- define "sockscale.selectorLabels" -}}
app.kubernetes.io/name: sockscale
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/*
An image reference: repository, then @digest if set, else :tag (default: the
chart's appVersion). Call with (dict "image" .Values.agent.image "ctx" $).
*/}}
{{- define "sockscale.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .ctx.Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}

{{/*
What agents and activators need to report to the controller, in one
projected volume: their ServiceAccount token for the controller's audience
(controller.statsAuth.audience), bound to the pod so that its TokenReview
names the pod and its node, worth nothing at the API server; the kubelet
renews it at 80 % of its hour and the senders read it for every batch.
With controller.statsTLS.enabled, also the CA of the stats serving
certificate (ca.crt only: the key stays with the controller).
*/}}
{{- define "sockscale.statsClient.dir" -}}
/var/run/secrets/sockscale.dev/stats-client
{{- end -}}

{{- define "sockscale.statsClient.args" -}}
- --controller-token-file={{ include "sockscale.statsClient.dir" . }}/token
{{- if .Values.controller.statsTLS.enabled }}
- --controller-ca-file={{ include "sockscale.statsClient.dir" . }}/ca.crt
{{- end }}
{{- end -}}

{{- define "sockscale.statsClient.volumeMount" -}}
- name: stats-client
  mountPath: {{ include "sockscale.statsClient.dir" . }}
  readOnly: true
{{- end -}}

{{- define "sockscale.statsClient.volume" -}}
- name: stats-client
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ .Values.controller.statsAuth.audience }}
          expirationSeconds: 3600
          path: token
      {{- if .Values.controller.statsTLS.enabled }}
      - secret:
          name: {{ include "sockscale.controller.statsTLSSecret" . }}
          items:
            - key: ca.crt
              path: ca.crt
      {{- end }}
{{- end -}}

{{/* The Secret with the stats endpoint's CA, serving certificate and key. */}}
{{- define "sockscale.controller.statsTLSSecret" -}}
{{- printf "%s-tls" (include "sockscale.controller.statsService" .) -}}
{{- end -}}

{{/*
The rules controller-gen generated from a component's +kubebuilder:rbac
markers (make generate), as a YAML list, so that the chart never writes
them twice. Arguments: ctx (the root context) and file (under files/rbac,
e.g. "agent/role.yaml").
*/}}
{{- define "sockscale.generatedRules" -}}
{{- $path := printf "files/rbac/%s" .file }}
{{- $generated := .ctx.Files.Get $path }}
{{- if not $generated }}
{{- fail (printf "%s is missing from the chart: run 'make generate' (controller-gen writes it from the +kubebuilder:rbac markers)" $path) }}
{{- end }}
{{- $role := $generated | fromYaml }}
{{- if hasKey $role "Error" }}
{{- fail (printf "%s does not parse: %s" $path $role.Error) }}
{{- end }}
{{- toYaml $role.rules }}
{{- end }}

{{/*
"true" when the agents hold leaving pods until drained: agent.drain.enabled
where the agent can (namespaceAccess, or hostNetwork: the wait listens on
the node's loopback and reaches the pods' connections through their
processes); else empty.
*/}}
{{- define "sockscale.drain" -}}
{{- if and .Values.agent.drain.enabled (or .Values.agent.namespaceAccess .Values.agent.hostNetwork) -}}
true
{{- end -}}
{{- end -}}

{{/*
The metrics flags of the agent and the activator (their <component>.metrics
values): HTTPS behind the API server's reviews unless secure is false, with
the certSecret's pair when one is given. "m" is the values, "ctx" the root.
*/}}
{{- define "sockscale.metrics.args" -}}
# HTTPS, each scrape's bearer token reviewed by the API server
# (TokenReview, SubjectAccessReview for get /metrics).
- --metrics-secure={{ .m.secure }}
{{- if .m.certSecret }}
- --metrics-cert-path=/etc/sockscale/metrics-certs
{{- end }}
{{- end -}}

{{- define "sockscale.metrics.volumeMount" -}}
{{- if .m.certSecret }}
- name: metrics-certs
  mountPath: /etc/sockscale/metrics-certs
  readOnly: true
{{- end }}
{{- end -}}

{{- define "sockscale.metrics.volume" -}}
{{- if .m.certSecret }}
- name: metrics-certs
  secret:
    secretName: {{ .m.certSecret }}
{{- end }}
{{- end -}}

{{/*
The endpoint settings of a monitor of a secure /metrics: Prometheus
presents a token with the <release>-metrics-reader ClusterRole and accepts
the self-signed certificate, or verifies the certSecret's against its
ca.crt as serverName. "m" is the component's metrics values, "serverName"
the name to verify, "token" the PodMonitor's Secret of the token (empty: a
ServiceMonitor, which reads Prometheus' own token file).
*/}}
{{- define "sockscale.metrics.endpointAuth" -}}
{{- if .m.secure }}
# Prometheus presents a token with the
# {{ include "sockscale.fullname" .ctx }}-metrics-reader ClusterRole.
scheme: https
{{- if .token }}
authorization:
  type: Bearer
  credentials:
    name: {{ .token }}
    key: token
{{- else }}
bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
{{- end }}
tlsConfig:
  {{- if .m.certSecret }}
  serverName: {{ .serverName }}
  ca:
    secret:
      name: {{ .m.certSecret }}
      key: ca.crt
  {{- else }}
  # The certificate is self-signed: encrypted, not verified.
  insecureSkipVerify: true
  {{- end }}
{{- end }}
{{- end -}}

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
"true" when the agents of one DaemonSet hold leaving pods until drained:
drain.enabled where the agent can (namespaceAccess, or hostNetwork: the
wait listens on the node's loopback and reaches the pods' connections
through their processes); else empty. Call with that DaemonSet's values
(.Values.agent, or a pool's: sockscale.agent.daemonsets).
*/}}
{{- define "sockscale.drain.on" -}}
{{- if and .drain.enabled (or .namespaceAccess .hostNetwork) -}}
true
{{- end -}}
{{- end -}}

{{/*
"true" when the agents of any DaemonSet (the main one or a pool's) drain:
then the controller gives serving Revisions the preStop hook, on the
chart-wide agent.drain.port. On a node whose agent does not drain the hook
finds no listener and fails at once; the kubelet goes on stopping the pod.
*/}}
{{- define "sockscale.drain" -}}
{{- $ds := dict }}
{{- include "sockscale.agent.daemonsets" (dict "ctx" . "out" $ds) }}
{{- $on := false }}
{{- range $ds.list }}
{{- if include "sockscale.drain.on" .values }}
{{- $on = true }}
{{- end }}
{{- end }}
{{- if $on -}}
true
{{- end -}}
{{- end -}}

{{/*
The node label that puts a node into an agent pool (agent.pools): its
nodes run the pool's DaemonSet, and the main one keeps off them.
*/}}
{{- define "sockscale.agent.poolLabel" -}}
sockscale.dev/agent-pool
{{- end -}}

{{/*
The agent keys a pool may set: what may differ between nodes and touches
no object but the pool's own DaemonSet.
*/}}
{{- define "sockscale.agent.poolKeys" -}}
{{- list "cgroupRoot" "bpffs" "capabilities" "privileged" "hostNetwork" "namespaceAccess" "drain" "nodeNetns" "connectionAuditPeriod" "reportPeriod" "logLevel" "extraArgs" "extraEnv" "resources" "priorityClassName" "tolerations" "nodeSelector" "affinity" "updateStrategy" "terminationGracePeriodSeconds" "podAnnotations" "podLabels" | toJson -}}
{{- end -}}

{{/*
The agent keys that stay chart-wide, with why: other objects (the
controller, the Service, the monitors, the NetworkPolicies, RBAC) are made
once for every agent.
*/}}
{{- define "sockscale.agent.chartWideKeys" -}}
{{- dict
  "image" "every agent runs the release's one version, which the controller and the activators speak to"
  "ports" "the metrics Service, the PodMonitor and the NetworkPolicies name one pair of ports for every agent"
  "metrics" "the PodMonitor scrapes every agent with one scheme and certificate"
  "activatorSelector" "the activators are the same pods for every node"
  "activatorNamespace" "the activators are the same pods for every node"
  "socketRedirect" "the agents' one ClusterRole follows it"
  "serviceAccount" "every agent DaemonSet runs as the one ServiceAccount"
  | toJson -}}
{{- end -}}

{{/*
Merges the map src into the map dst, in place: a key whose values are maps
on both sides is merged the same way, anything else (a list, a scalar,
false, an empty list or map) replaces dst's. Sprig's mergeOverwrite does
not do: it skips false and empty values of src, so a pool could not turn
namespaceAccess off or empty its tolerations.
Call with (dict "dst" $dst "src" $src).
*/}}
{{- define "sockscale.mergeInto" -}}
{{- $dst := .dst }}
{{- range $k, $v := .src }}
{{- if and (kindIs "map" $v) (kindIs "map" (get $dst $k)) }}
{{- include "sockscale.mergeInto" (dict "dst" (get $dst $k) "src" $v) }}
{{- else }}
{{- $_ := set $dst $k $v }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The agent's DaemonSets, each with the values it is rendered from. Sets
.out.list (call with (dict "ctx" $ "out" $out)) to a list of dicts:
  name    the DaemonSet's name
  pool    the pool's name; "" for the main DaemonSet
  path    where its values are set, for messages: "agent" or "agent.pools.<pool>"
  values  its agent values
The main DaemonSet first, with .Values.agent itself unless there are pools;
then the main one also keeps off every pool's nodes (a required node
affinity "<poolLabel> NotIn <the pools>", ANDed into each of
agent.affinity's required terms). Then one per pool, in name order: agent
(without pools) deep-merged with the pool's map (sockscale.mergeInto), on
the nodes labelled <poolLabel>=<pool> (added to its nodeSelector).
Fails naming the value for a bad pool name, a name too long for its
DaemonSet, and a key a pool may not set.
*/}}
{{- define "sockscale.agent.daemonsets" -}}
{{- $ctx := .ctx }}
{{- $agent := $ctx.Values.agent }}
{{- $main := include "sockscale.agent.fullname" $ctx }}
{{- $label := include "sockscale.agent.poolLabel" $ctx }}
{{- $pools := $agent.pools | default dict }}
{{- $mainValues := $agent }}
{{- if $pools }}
{{- $mainValues = deepCopy $agent }}
{{- $notIn := dict "key" $label "operator" "NotIn" "values" (keys $pools | sortAlpha) }}
{{- $affinity := $mainValues.affinity | default dict }}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $terms := list }}
{{- range get $required "nodeSelectorTerms" | default list }}
{{- $terms = append $terms (set . "matchExpressions" (append (get . "matchExpressions" | default list) $notIn)) }}
{{- end }}
{{- if not $terms }}
{{- $terms = list (dict "matchExpressions" (list $notIn)) }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ = set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ = set $affinity "nodeAffinity" $nodeAffinity }}
{{- $_ = set $mainValues "affinity" $affinity }}
{{- end }}
{{- $list := list (dict "name" $main "pool" "" "path" "agent" "values" $mainValues) }}
{{- $poolKeys := include "sockscale.agent.poolKeys" $ctx | fromJsonArray }}
{{- $chartWide := include "sockscale.agent.chartWideKeys" $ctx | fromJson }}
{{- range $pool, $over := $pools }}
{{- $path := printf "agent.pools.%s" $pool }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $pool) }}
{{- fail (printf "agent.pools: pool name %q is not a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit" $pool) }}
{{- end }}
{{- $name := printf "%s-%s" $main $pool }}
{{- if gt (len $name) 63 }}
{{- fail (printf "agent.pools: pool name %q makes the DaemonSet name %q, %d characters; Kubernetes allows 63, so a pool's name may have at most %d here" $pool $name (len $name) (sub 62 (len $main))) }}
{{- end }}
{{- if not (kindIs "map" $over) }}
{{- fail (printf "%s: want a map of agent settings (may be empty: {}), got %v" $path $over) }}
{{- end }}
{{- range $key, $_ := $over }}
{{- if eq $key "pools" }}
{{- fail (printf "%s.pools: pools do not nest" $path) }}
{{- else if hasKey $chartWide $key }}
{{- fail (printf "%s.%s: chart-wide, a pool may not set it (%s); set agent.%s" $path $key (get $chartWide $key) $key) }}
{{- else if not (has $key $poolKeys) }}
{{- fail (printf "%s.%s: not a key a pool may set; a pool may set %s" $path $key (join ", " $poolKeys)) }}
{{- end }}
{{- end }}
{{- $drain := get $over "drain" }}
{{- if and (kindIs "map" $drain) (hasKey $drain "port") }}
{{- fail (printf "%s.drain.port: chart-wide, a pool may not set it (the controller gives every serving Revision's pods one preStop hook, on one port); set agent.drain.port" $path) }}
{{- end }}
{{- $values := omit $agent "pools" | deepCopy }}
{{- include "sockscale.mergeInto" (dict "dst" $values "src" (deepCopy $over)) }}
{{- $nodeSelector := $values.nodeSelector | default dict }}
{{- $_ := set $nodeSelector $label $pool }}
{{- $_ = set $values "nodeSelector" $nodeSelector }}
{{- $list = append $list (dict "name" $name "pool" $pool "path" $path "values" $values) }}
{{- end }}
{{- $_ := set .out "list" $list }}
{{- end -}}

{{/*
Selector labels of one agent DaemonSet (call with (dict "ctx" $ "pool"
<pool>), "" for the main one). The main one's are those of every release
before pools (a DaemonSet's selector cannot change). A pool's pods carry
component "agent-pool" instead of "agent" and the pool's label: no
DaemonSet's selector matches another's pods.
*/}}
{{- define "sockscale.agent.selectorLabels" -}}
{{- if .pool -}}
{{ include "sockscale.selectorLabels" (dict "ctx" .ctx "component" "agent-pool") }}
{{ include "sockscale.agent.poolLabel" .ctx }}: {{ .pool }}
{{- else -}}
{{ include "sockscale.selectorLabels" (dict "ctx" .ctx "component" "agent") }}
{{- end -}}
{{- end -}}

{{/*
A LabelSelector (its fields) of every agent pod of the release, whatever
its DaemonSet: for the PodMonitor and the NetworkPolicies. Without pools
the main DaemonSet's selector labels, as before pools existed; with pools
the component "agent" or "agent-pool", a set-based requirement, which the
main DaemonSet's pods match before and after the upgrade that adds the
first pool (a new label would leave the agents not yet rolled out of the
stats NetworkPolicy until their turn).
*/}}
{{- define "sockscale.agent.podSelector" -}}
{{- if .Values.agent.pools -}}
matchLabels:
  {{- include "sockscale.selectorLabels" (dict "ctx" .) | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: [agent, agent-pool]
{{- else -}}
matchLabels:
  {{- include "sockscale.selectorLabels" (dict "ctx" . "component" "agent") | nindent 2 }}
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

{{/*
The controller's --scale-target-kinds: controller.scaleTargets as
Kind.group (Kind alone for the core group), comma-separated.
*/}}
{{- define "sockscale.scaleTargetKinds" -}}
{{- $kinds := list -}}
{{- range .Values.controller.scaleTargets -}}
{{- $kinds = append $kinds (ternary .kind (printf "%s.%s" .kind .group) (eq .group "")) -}}
{{- end -}}
{{- join "," $kinds -}}
{{- end }}

{{/*
The scale targets whose scale subresource the controller's generated
ClusterRole does not grant (its RBAC markers grant Deployments' and
StatefulSets'), as YAML: a list of {group, resource}.
*/}}
{{- define "sockscale.extraScaleTargets" -}}
{{- $extra := list -}}
{{- range .Values.controller.scaleTargets -}}
{{- if not (and (eq .group "apps") (has .resource (list "deployments" "statefulsets"))) -}}
{{- $extra = append $extra (dict "group" .group "resource" .resource) -}}
{{- end -}}
{{- end -}}
{{- toYaml $extra -}}
{{- end }}

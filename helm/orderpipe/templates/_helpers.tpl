{{/* Names and labels shared by every object of the chart. */}}
{{- define "orderpipe.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orderpipe.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one role: "orderpipe.selector" (list . "relay") */}}
{{- define "orderpipe.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "orderpipe.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* A DNS-safe name for a consumer group's objects. */}}
{{- define "orderpipe.groupName" -}}
{{- regexReplaceAll "[^a-z0-9-]" (lower .) "-" | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The container environment: config file, secrets by reference only. */}}
{{- define "orderpipe.env" -}}
- name: ORDERPIPE_CONFIG
  value: /etc/orderpipe/orderpipe.json
- name: ORDERPIPE_DATABASE__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.existingSecret }}
      key: {{ .Values.secretKeys.databaseUrl }}
{{- if .Values.secretKeys.saslPassword }}
- name: ORDERPIPE_KAFKA__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.existingSecret }}
      key: {{ .Values.secretKeys.saslPassword }}
{{- end }}
{{- if .Values.secretKeys.registryPassword }}
- name: ORDERPIPE_REGISTRY__PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.existingSecret }}
      key: {{ .Values.secretKeys.registryPassword }}
{{- end }}
- name: HOSTNAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end -}}

{{/* Pod volumes of the Deployments and the CronJob: the release's config ConfigMap. */}}
{{- define "orderpipe.volumes" -}}
{{ include "orderpipe.volumesOf" (list . (include "orderpipe.fullname" .)) }}
{{- end -}}

{{/* Pod volumes of the hook Jobs: the hook copy of the config, created before them. */}}
{{- define "orderpipe.hookVolumes" -}}
{{ include "orderpipe.volumesOf" (list . (printf "%s-hooks" (include "orderpipe.fullname" .))) }}
{{- end -}}

{{/* Pod volumes reading the config from one ConfigMap: "orderpipe.volumesOf" (list . NAME) */}}
{{- define "orderpipe.volumesOf" -}}
{{- $root := index . 0 -}}
volumes:
  - name: config
    configMap:
      name: {{ index . 1 }}
      items: [{key: orderpipe.json, path: orderpipe.json}]
  {{- if $root.Values.secretKeys.kafkaCa }}
  - name: kafka-ca
    secret:
      secretName: {{ $root.Values.existingSecret }}
      items: [{key: {{ $root.Values.secretKeys.kafkaCa }}, path: ca.crt}]
  {{- end }}
  - name: tmp
    emptyDir: {}
{{- end -}}

{{- define "orderpipe.mounts" -}}
volumeMounts:
  - name: config
    mountPath: /etc/orderpipe
    readOnly: true
  {{- if .Values.secretKeys.kafkaCa }}
  - name: kafka-ca
    mountPath: {{ include "orderpipe.kafkaCaDir" . }}
    readOnly: true
  {{- end }}
  - name: tmp
    mountPath: /tmp
{{- end -}}

{{/* Where the Kafka CA (secretKeys.kafkaCa) is mounted; ssl.ca.location points into it. */}}
{{- define "orderpipe.kafkaCaDir" -}}
/etc/orderpipe-kafka-ca
{{- end -}}

{{/* Kafka security of the rendered config: a dict with protocol, sasl (bool),
     tls (bool), mechanism and username, from config.kafka.options. */}}
{{- define "orderpipe.kafkaSecurity" -}}
{{- $options := dig "kafka" "options" (dict) .Values.config -}}
{{- $protocol := upper (get $options "security.protocol" | default "PLAINTEXT") -}}
{{- toJson (dict "protocol" $protocol "sasl" (hasPrefix "SASL_" $protocol) "tls" (hasSuffix "SSL" $protocol)
      "mechanism" (upper (get $options "sasl.mechanism" | default "")) "username" (get $options "sasl.username" | default "")) -}}
{{- end -}}

{{/* The config file every role and hook reads (JSON keeps integers exact;
     Helm's toToml writes every number as a float): values.config, plus one
     http.subscriptions entry per subscriptions[] item (without the chart's own
     keys), ssl.ca.location when secretKeys.kafkaCa is set, and lag.groups
     (unless set) naming every consumer and subscription group, and
     producer.transactional_id_prefix, outbox.binlog_name and
     outbox.offsets_topic (unless set) per release, and each
     consumers[].retry as retry.groups."<group>". Fails the render on values
     that cannot work (a bad retry value, a group name outside the house
     pattern unless naming.enforce is false), naming them. */}}
{{- define "orderpipe.configJson" -}}
{{- $config := deepCopy .Values.config -}}
{{- /* Secrets come from existingSecret, never from the ConfigMap. */ -}}
{{- if dig "cdc" "source" "" $config -}}
{{- fail "config.cdc.source is a secret (the binlog source's user:password): put it in existingSecret and name its key in secretKeys.cdcSource" -}}
{{- end -}}
{{- if dig "admin" "token" "" $config -}}
{{- fail "config.admin.token is a secret: put it in existingSecret and name its key in secretKeys.adminToken" -}}
{{- end -}}
{{- range $key, $secretKey := dict "viewer_token" "consoleViewerToken" "operator_token" "consoleOperatorToken" -}}
{{- if dig "console" $key "" $config -}}
{{- fail (printf "config.console.%s is a secret: put it in existingSecret and name its key in secretKeys.%s" $key $secretKey) -}}
{{- end -}}
{{- end -}}
{{- $security := include "orderpipe.kafkaSecurity" . | fromJson -}}
{{- if and $security.sasl (has $security.mechanism (list "PLAIN" "SCRAM-SHA-256" "SCRAM-SHA-512")) -}}
{{- if not .Values.secretKeys.saslPassword -}}
{{- fail (printf "config.kafka.options security.protocol is %s with sasl.mechanism %s, but secretKeys.saslPassword is empty: name the key of existingSecret that holds the SASL password" $security.protocol $security.mechanism) -}}
{{- end -}}
{{- if not $security.username -}}
{{- fail (printf "config.kafka.options security.protocol is %s with sasl.mechanism %s, but sasl.username is not set" $security.protocol $security.mechanism) -}}
{{- end -}}
{{- end -}}
{{- if .Values.secretKeys.kafkaCa -}}
{{- $kafka := get $config "kafka" -}}
{{- $options := get $kafka "options" | default (dict) -}}
{{- if hasKey $options "ssl.ca.location" -}}
{{- fail "set either secretKeys.kafkaCa (the chart mounts the CA and sets ssl.ca.location) or config.kafka.options ssl.ca.location, not both" -}}
{{- end -}}
{{- $_ := set $options "ssl.ca.location" (printf "%s/ca.crt" (include "orderpipe.kafkaCaDir" .)) -}}
{{- $_ := set $kafka "options" $options -}}
{{- end -}}
{{- /* Relay transactional ids are per shard (<prefix>-shard-<n>): a prefix per
     release, so two releases on one cluster never fence each other. */ -}}
{{- $producer := get $config "producer" | default (dict) -}}
{{- if not (hasKey $producer "transactional_id_prefix") -}}
{{- $_ := set $producer "transactional_id_prefix" (printf "%s-relay" (include "orderpipe.fullname" .)) -}}
{{- $_ := set $config "producer" $producer -}}
{{- end -}}
{{- /* The log-based relay's checkpoint key and lease (outbox.binlog_name) and its
     offsets topic: per release too, so two releases never resume from each
     other's binlog position. */ -}}
{{- $outbox := get $config "outbox" | default (dict) -}}
{{- if not (hasKey $outbox "binlog_name") -}}
{{- $_ := set $outbox "binlog_name" (printf "%s-outbox" (include "orderpipe.fullname" .)) -}}
{{- end -}}
{{- if not (hasKey $outbox "offsets_topic") -}}
{{- $_ := set $outbox "offsets_topic" (printf "%s.outbox.offsets" (include "orderpipe.fullname" .)) -}}
{{- end -}}
{{- $_ := set $config "outbox" $outbox -}}
{{- if .Values.subscriptions -}}
{{- if dig "http" "subscriptions" (list) $config -}}
{{- fail "declare HTTP subscriptions under subscriptions[] (one deliver Deployment each), not config.http.subscriptions" -}}
{{- end -}}
{{- $subscriptions := list -}}
{{- $names := list -}}
{{- range .Values.subscriptions -}}
{{- if not .name -}}
{{- fail "subscriptions[].name is required (the deliver Deployment and the group http.<name> are named after it)" -}}
{{- end -}}
{{- if has .name $names -}}
{{- fail (printf "subscriptions[].name %q is declared twice" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- $subscriptions = append $subscriptions (omit . "replicas" "resources" "group" "ordering") -}}
{{- end -}}
{{- $_ := set $config "http" (merge (dict "subscriptions" $subscriptions) (get $config "http" | default (dict))) -}}
{{- end -}}
{{- /* The DLQ persister exports broker-side lag (so alerts fire with every member
     down) for lag.groups: by default every group the chart runs. */ -}}
{{- if not (dig "lag" "groups" (list) $config) -}}
{{- $groups := list -}}
{{- range .Values.consumers -}}
{{- $groups = append $groups .group -}}
{{- end -}}
{{- range .Values.subscriptions -}}
{{- $groups = append $groups (.group | default (printf "http.%s" .name)) -}}
{{- end -}}
{{- if $groups -}}
{{- $_ := set $config "lag" (merge (dict "groups" $groups) (get $config "lag" | default (dict))) -}}
{{- end -}}
{{- end -}}
{{- /* Retry schedules: config.retry, and each consumers[].retry as the group's
     layer retry.groups."<group>"; subscriptions[].retry goes into its
     http.subscriptions entry. Group names follow the house pattern. */ -}}
{{- $retry := get $config "retry" | default (dict) -}}
{{- $retryGroups := get $retry "groups" | default (dict) -}}
{{- range $group, $layer := $retryGroups -}}
{{- include "orderpipe.checkRetry" (dict "retry" $layer "field" (printf "config.retry.groups.%s" $group)) -}}
{{- end -}}
{{- range .Values.consumers -}}
{{- if not (kindIs "string" .group) -}}
{{- fail "consumers[].group is required: the consumer group of the Deployment, e.g. inventory-service.order.consumer" -}}
{{- end -}}
{{- $field := printf "consumers[%s]" .group -}}
{{- include "orderpipe.checkGroupName" (dict "root" $ "group" .group "field" (printf "%s.group" $field)) -}}
{{- if hasKey . "retry" -}}
{{- include "orderpipe.checkRetry" (dict "retry" .retry "field" (printf "%s.retry" $field)) -}}
{{- if hasKey $retryGroups .group -}}
{{- fail (printf "%s.retry and config.retry.groups.%s: both set; keep one" $field .group) -}}
{{- end -}}
{{- $_ := set $retryGroups .group .retry -}}
{{- end -}}
{{- end -}}
{{- if $retryGroups -}}
{{- $_ := set $retry "groups" $retryGroups -}}
{{- $_ := set $config "retry" $retry -}}
{{- end -}}
{{- range .Values.subscriptions -}}
{{- $field := printf "subscriptions[%s]" .name -}}
{{- $group := .group | default (printf "http.%s" .name) -}}
{{- $groupField := printf "%s.group" $field -}}
{{- if not .group -}}
{{- $groupField = printf "%s.group (unset: the default http.%s)" $field .name -}}
{{- end -}}
{{- include "orderpipe.checkGroupName" (dict "root" $ "group" $group "field" $groupField) -}}
{{- if hasKey . "retry" -}}
{{- include "orderpipe.checkRetry" (dict "retry" .retry "field" (printf "%s.retry" $field)) -}}
{{- end -}}
{{- end -}}
{{- toPrettyJson $config -}}
{{- end -}}

{{/* The house pattern of consumer group names (seed 000): {service}.{event}.consumer.
     The same expression as src/consumer/naming.rs (GROUP_PATTERN). */}}
{{- define "orderpipe.groupPattern" -}}
^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+\.consumer$
{{- end -}}

{{/* Fails the render on a group outside the house pattern, unless naming.enforce is false:
     "orderpipe.checkGroupName" (dict "root" $ "group" G "field" F) */}}
{{- define "orderpipe.checkGroupName" -}}
{{- $enforce := true -}}
{{- if hasKey (.root.Values.naming | default (dict)) "enforce" -}}
{{- $enforce = .root.Values.naming.enforce -}}
{{- end -}}
{{- if and $enforce (not (regexMatch (include "orderpipe.groupPattern" .root) .group)) -}}
{{- fail (printf "%s: consumer group %q does not follow the house pattern {service}.{event}.consumer, e.g. inventory-service.order.consumer; rename it (a new name is a new group, with no offsets: docs/helm.md, \"Consumer group names\"), or set naming.enforce: false to keep it" .field .group) -}}
{{- end -}}
{{- end -}}

{{/* Fails the render on a retry table orderpipe would refuse, naming the field:
     "orderpipe.checkRetry" (dict "retry" R "field" F). The binary checks the
     rest (ranges, a fixed profile reshaped) when it loads the config. */}}
{{- define "orderpipe.checkRetry" -}}
{{- $retry := .retry -}}
{{- $field := .field -}}
{{- if not (kindIs "map" $retry) -}}
{{- fail (printf "%s: a table is expected, e.g. {delays: [5s, 30s, 5m], jitter: 0.1}" $field) -}}
{{- end -}}
{{- $keys := list "local_retries" "profile" "delays" "jitter" "attempts" "initial_delay_ms" "multiplier" "max_delay_ms" -}}
{{- range $key, $_ := $retry -}}
{{- if not (has $key $keys) -}}
{{- fail (printf "%s.%s: not a retry setting; accepted: %s" $field $key (join ", " $keys)) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $retry "delays" -}}
{{- range $other := list "profile" "attempts" "initial_delay_ms" "multiplier" "max_delay_ms" -}}
{{- if hasKey $retry $other -}}
{{- fail (printf "%s.delays and %s.%s: both set: an explicit list of delays or a profile with its geometric overrides, not both" $field $field $other) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "slice" $retry.delays) -}}
{{- fail (printf "%s.delays: a list is expected, e.g. [5s, 30s, 5m]" $field) -}}
{{- end -}}
{{- range $i, $delay := $retry.delays -}}
{{- if not (and (kindIs "string" $delay) (regexMatch "^[1-9][0-9]*(ms|s|m|h)$" $delay)) -}}
{{- fail (printf "%s.delays[%d]: %v is not a delay; accepted forms: <n>ms, <n>s, <n>m or <n>h (e.g. \"500ms\", \"30s\", \"5m\", \"1h\"), from 1ms to 24h" $field $i $delay) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if hasKey $retry "jitter" -}}
{{- if not (and (or (kindIs "float64" $retry.jitter) (kindIs "int" $retry.jitter) (kindIs "int64" $retry.jitter)) (ge (float64 $retry.jitter) 0.0) (le (float64 $retry.jitter) 1.0)) -}}
{{- fail (printf "%s.jitter: %v is not a number from 0 to 1 (a fraction of each delay, e.g. 0.1; helm --set passes it as a string: use a values file or --set-json)" $field $retry.jitter) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $retry "profile" -}}
{{- $profiles := list "default" "10s-1m-5m" "10s-30s-1m-5m" "5s-30s-5m" -}}
{{- $aliases := list "seed000" "seed001" "seed003" -}}
{{- if not (or (has $retry.profile $profiles) (has $retry.profile $aliases)) -}}
{{- fail (printf "%s.profile: %v is not a profile; accepted: %s (older names: %s)" $field $retry.profile (join ", " $profiles) (join ", " $aliases)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Ports and probes of a role: "orderpipe.probes" (dict "Values" V "ports" EXTRA "readyPath" P);
     ports (extra named ports) and readyPath (default /health/ready) are optional. */}}
{{- define "orderpipe.probes" -}}
ports:
  - name: http
    containerPort: {{ .Values.httpPort }}
  {{- range .ports }}
  - name: {{ .name }}
    containerPort: {{ .containerPort }}
  {{- end }}
livenessProbe:
  httpGet: {path: /health/live, port: http}
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet: {path: {{ .readyPath | default "/health/ready" }}, port: http}
  periodSeconds: 5
  failureThreshold: 3
{{- end -}}


{{/* One container of a hook Job: "orderpipe.hookContainer" (list . (dict "name" N "args" A)) */}}
{{- define "orderpipe.hookContainer" -}}
{{- $root := index . 0 -}}
{{- $step := index . 1 -}}
- name: {{ $step.name }}
  image: {{ include "orderpipe.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args:
    {{- toYaml $step.args | nindent 4 }}
  env:
    {{- include "orderpipe.env" $root | nindent 4 }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  resources:
    requests: {cpu: 50m, memory: 64Mi}
    limits: {cpu: 500m, memory: 256Mi}
  {{- include "orderpipe.mounts" $root | nindent 2 }}
{{- end -}}

{{/* "1|2|...|N": the retry attempt numbers up to N, for a label regex (N >= 1). */}}
{{- define "orderpipe.attemptsUpTo" -}}
{{- $n := int . -}}
{{- if lt $n 1 -}}{{- fail (printf "alerts.maxRetries is %v; accepted: a whole number of 1 or more" .) -}}{{- end -}}
{{- $attempts := list -}}
{{- range $i := until $n -}}{{- $attempts = append $attempts (toString (add1 $i)) -}}{{- end -}}
{{- join "|" $attempts -}}
{{- end -}}

{{/* The ServiceAccount of the release's pods: serviceAccount.name, else the
     release's full name when the chart creates it, else the namespace's default. */}}
{{- define "orderpipe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "orderpipe.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of the hook Jobs: a hook copy (<name>-hooks) when the chart
     creates the account (Helm creates hooks before the release's other objects,
     so the hooks cannot use it on a first install), else the user's account. */}}
{{- define "orderpipe.hookServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-hooks" (include "orderpipe.serviceAccountName" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- include "orderpipe.serviceAccountName" . -}}
{{- end -}}
{{- end -}}

{{/* A pod's identity: "orderpipe.podAccount" (list . HOOK). orderpipe never calls the
     Kubernetes API: no pod mounts a service account token. */}}
{{- define "orderpipe.podAccount" -}}
{{- $root := index . 0 -}}
{{- if index . 1 -}}
serviceAccountName: {{ include "orderpipe.hookServiceAccountName" $root }}
{{- else -}}
serviceAccountName: {{ include "orderpipe.serviceAccountName" $root }}
{{- end }}
automountServiceAccountToken: false
{{- end -}}

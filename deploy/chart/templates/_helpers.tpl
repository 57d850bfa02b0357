{{/* The image reference: repository:tag, pinned by @digest when one is given. */}}
{{- define "fgpu.image" -}}
{{- $ref := printf "%s:%s" .repository (toString .tag) -}}
{{- if .digest -}}{{- $ref = printf "%s@%s" $ref .digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* The service account name the API server gives a pod of `name` in the release namespace. */}}
{{- define "fgpu.serviceAccountUser" -}}
system:serviceaccount:{{ .ns }}:{{ .name }}
{{- end -}}

{{/* Refuses values the chart cannot render into a working install. */}}
{{- define "fgpu.validate" -}}
{{- if not (has .Values.mode (list "extender" "standalone")) -}}
{{- fail (printf "mode=%q: use extender (the default: kube-scheduler with fgpu-scheduler as its extender) or standalone" (toString .Values.mode)) -}}
{{- end -}}
{{- if not (has .Values.signingKeys.source (list "generate" "existing" "values")) -}}
{{- fail (printf "signingKeys.source=%q: use generate, existing or values" (toString .Values.signingKeys.source)) -}}
{{- end -}}
{{- if not (has .Values.webhook.tls.source (list "helm" "certManager" "existing")) -}}
{{- fail (printf "webhook.tls.source=%q: use helm, certManager or existing" (toString .Values.webhook.tls.source)) -}}
{{- end -}}
{{- $pools := .Values.agent.pools -}}
{{- if not $pools -}}
{{- fail "agent.pools is empty: give at least one pool, e.g. [{name: default, isolation: hami-core}]" -}}
{{- end -}}
{{- $seen := dict -}}
{{- $selectors := dict -}}
{{- range $pools -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$" (toString .name)) -}}
{{- fail (printf "agent.pools: name %q must be a DNS label of at most 32 characters" (toString .name)) -}}
{{- end -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "agent.pools: pool %q is listed twice" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- if not (has .isolation (list "hami-core" "mps" "none")) -}}
{{- fail (printf "agent.pools[%s].isolation=%q: use hami-core, mps or none" .name (toString .isolation)) -}}
{{- end -}}
{{- if and (gt (len $pools) 1) (not .nodeSelector) -}}
{{- fail (printf "agent.pools[%s] has no nodeSelector: with more than one pool each needs one, or two agents would run on one node" .name) -}}
{{- end -}}
{{- $key := toJson (.nodeSelector | default dict) -}}
{{- if hasKey $selectors $key -}}
{{- fail (printf "agent.pools[%s] has the nodeSelector of pool %s: each node runs one agent" .name (get $selectors $key)) -}}
{{- end -}}
{{- $_ := set $selectors $key .name -}}
{{- if and .overcommit (not $.Values.admissionPolicies.enabled) -}}
{{- fail (printf "agent.pools[%s].overcommit needs admissionPolicies.enabled=true: reclaim gives the agent the right to delete pods, and only the admission policy fgpu-agent-reclaims-own-burstable-pods (Kubernetes 1.30+) confines it to burstable pods on the agent's own node; without it any agent could delete any pod in the cluster. Set admissionPolicies.enabled=true, or remove overcommit from the pool" .name) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.hamiCore.install (not .Values.hamiCore.image.digest) -}}
{{- fail "hamiCore.image.digest is empty: HAMi's image is pulled by digest (sha256:...), or set hamiCore.install=false and install libvgpu.so on the nodes yourself" -}}
{{- end -}}
{{- end -}}

{{/* A pool's object name suffix: "" for the pool named default, "-<name>" otherwise. */}}
{{- define "fgpu.poolSuffix" -}}
{{- if ne .name "default" -}}-{{ .name }}{{- end -}}
{{- end -}}

{{/* Both webhooks' namespaceSelector: never kube-system or the release namespace, plus webhook.namespaceSelector. */}}
{{- define "fgpu.webhookNamespaceSelector" -}}
{{- $extra := .Values.webhook.namespaceSelector | default dict -}}
{{- $expressions := list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" (list "kube-system" .Release.Namespace)) -}}
{{- $expressions = concat $expressions ($extra.matchExpressions | default list) -}}
{{- $selector := dict "matchExpressions" $expressions -}}
{{- with $extra.matchLabels -}}{{- $_ := set $selector "matchLabels" . -}}{{- end -}}
{{- toYaml $selector -}}
{{- end -}}

{{/* What the scheduler Pod's daemons read once at start, hashed: the data of fgpu-scheduler's
ConfigMap and (extender mode) kube-scheduler's, whose managedResources come from the chart's rules
file. Not the rules ConfigMap, keys or verifying keys, which fgpu-scheduler re-reads on change. A
change rolls the Pod (checksum/config annotation). */}}
{{- define "fgpu.schedulerConfigChecksum" -}}
{{- $fgpu := (include (print .Template.BasePath "/20-scheduler-config.yaml") . | fromYaml).data -}}
{{- $kube := (include (print .Template.BasePath "/20-kube-scheduler-config.yaml") . | fromYaml).data -}}
{{- toJson (list $fgpu $kube) | sha256sum -}}
{{- end -}}

{{/* fgpu-webhook's --config file (webhook/config.py), read once at start: ConfigMap
fgpu-webhook-config holds it and the Deployment's checksum/config annotation hashes it. */}}
{{- define "fgpu.webhookConfig" -}}
translationRules: /etc/fgpu/rules/rules.yaml
{{- with .Values.webhook.schedulerInjection }}
schedulerInjection:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{/* Standalone mode's podAntiAffinity: spread the scheduler replicas over nodes. */}}
{{- define "fgpu.schedulerSpread" -}}
preferredDuringSchedulingIgnoredDuringExecution:
  - weight: 100
    podAffinityTerm:
      topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          app.kubernetes.io/name: fgpu-scheduler
{{- end -}}

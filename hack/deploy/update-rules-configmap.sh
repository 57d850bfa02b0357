#!/usr/bin/env bash
# Regenerates 20-translation-rules.yaml from apis/rules/default.yaml, the
# built-in rules, so the cluster starts with exactly what the code ships.
# tests/localup/test_manifests.py fails when the two differ.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rules="$here/../../apis/rules/default.yaml"
{
  cat <<'HEAD'
# Translation rules for fgpu-scheduler: how other products' GPU resources
# (nvidia.com/gpu, HAMi, Volcano, Aliyun, qGPU) become Koordinator device
# requests. Generated from apis/rules/default.yaml by
# hack/deploy/update-rules-configmap.sh; edit the cluster copy freely, the
# scheduler reloads it when it changes and keeps the last good rules on error.
# Format: docs/translation-rules.md.
apiVersion: v1
kind: ConfigMap
metadata:
  name: fgpu-translation-rules
  namespace: fgpu-system
  labels:
    app.kubernetes.io/name: fgpu-scheduler
    app.kubernetes.io/part-of: fgpu
data:
  rules.yaml: |
HEAD
  sed -e 's/^/    /' -e 's/^    $//' "$rules"
} > "$here/20-translation-rules.yaml"

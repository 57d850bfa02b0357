#!/usr/bin/env bash
# Copies apis/rules/default.yaml, the built-in rules, into the chart
# (deploy/chart/files/translation-rules.yaml) and renders hack/deploy/ again,
# so the cluster starts with exactly what the code ships. The same file gives
# kube-scheduler's extender its managedResources (every resource a rule reads,
# templates/20-kube-scheduler-config.yaml), so a vendor added to the rules is
# routed to fgpu in extender mode too, with no other edit.
# tests/localup/test_manifests.py fails when the two differ.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root="$here/../.."
cp "$root/apis/rules/default.yaml" "$root/deploy/chart/files/translation-rules.yaml"
exec "$root/hack/render-manifests.sh"

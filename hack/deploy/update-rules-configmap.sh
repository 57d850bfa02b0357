#!/usr/bin/env bash
# Copies apis/rules/default.yaml, the built-in rules, into the chart
# (deploy/chart/files/translation-rules.yaml) and renders hack/deploy/ again,
# so the cluster starts with exactly what the code ships.
# tests/localup/test_manifests.py fails when the two differ.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root="$here/../.."
cp "$root/apis/rules/default.yaml" "$root/deploy/chart/files/translation-rules.yaml"
exec "$root/hack/render-manifests.sh"

#!/usr/bin/env bash
# Renders hack/deploy/ from the Helm chart in deploy/chart/ (hack/render_manifests.py says what
# goes where). --check only compares, and exits 1 naming each file that differs.
# Needs the venv with helm-python-sdk (Helm's template engine), which .ci/run installs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=python3
if [ -x .venv/bin/python ]; then py=.venv/bin/python; fi
exec "$py" -m hack.render_manifests "$@"

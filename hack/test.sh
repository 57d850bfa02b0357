#!/usr/bin/env bash
# The project's test command: generated code fresh, lint, types, layering, tests.
# Usage: hack/test.sh [pytest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ -x .venv/bin/python ]; then export PATH="$root/.venv/bin:$PATH"; fi
echo "== verify generated protobuf code"; hack/verify-proto.sh
echo "== ruff"; ruff check .
echo "== mypy"; mypy apis runtimeproxy agent scheduler_plugin fgpuctl webhook setup.py && mypy --explicit-package-bases hack/localup
echo "== import layering"; lint-imports
echo "== pytest"; python -m pytest -q --durations=15 "$@"

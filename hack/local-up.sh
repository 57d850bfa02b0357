#!/usr/bin/env bash
# The whole of fgpu on this machine: containerd, fgpu-scheduler (embedded
# SQLite state), fgpu-agent on a fake 8-GPU NVLink node and
# fgpu-runtime-proxy, then the pods in examples/local through all of them.
#
#   hack/local-up.sh            # run the demo, print the table, stop everything
#   hack/local-up.sh --keep     # leave it running; prints grpcurl/fgpuctl commands
#   hack/local-up.sh --down     # stop what --keep left running
#   hack/local-up.sh --descheduler KUBECONFIG   # also fgpu-descheduler, dry-run (off by default)
#   hack/local-up.sh --overcommit-demo          # instead: a Kubernetes-mode stack (API double) where a
#                                                # burstable pod is admitted, then evicted (docs/overcommit.md)
#   hack/local-up.sh --help     # the other options (work dir, inventory, isolation, --json)
#
# Needs root (containerd, runc). Installs what is missing: containerd, runc
# and busybox-static with apt, and the project into .venv with pip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [ "$(id -u)" -ne 0 ]; then
  echo "hack/local-up.sh needs root (containerd and runc create namespaces and mounts); try: sudo $0 $*" >&2
  exit 2
fi

down_only=false
for arg in "$@"; do [ "$arg" = "--down" ] && down_only=true; done

if ! $down_only; then
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "fgpu needs Python >= 3.11; python3 is $(python3 --version 2>&1). Install python3.11 (e.g. apt-get install python3.11 python3.11-venv) and put it first on PATH." >&2
    exit 1
  fi
  need=()
  # busybox-static, not busybox: the images hold that one binary and no libc.
  for pkg in containerd runc busybox-static; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
  # Debian and Ubuntu ship venv's ensurepip separately.
  python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=("python3-venv")
  if [ ${#need[@]} -gt 0 ]; then
    echo "==> installing ${need[*]} (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  fi
fi

# The venv: created and filled once; later runs only check that it imports.
py=.venv/bin/python
ready() {
  for tool in python fgpu-agent fgpu-scheduler fgpu-descheduler fgpu-runtime-proxy fgpuctl; do
    [ -x ".venv/bin/$tool" ] || return 1
  done
  "$py" -c 'import agent, scheduler_plugin, runtimeproxy, fgpuctl, grpc, grpc_health, yaml' 2>/dev/null
}
if ! ready; then
  echo "==> installing fgpu into .venv (pip, first run only)"
  [ -x "$py" ] || python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e .
fi

# Python runs the stack; it handles Ctrl-C and SIGTERM itself and cleans up.
exec "$py" -m hack.localup "$@"

#!/usr/bin/env bash
# Regenerates the committed Python code for every .proto under proto/ into apis/.
# proto/fgpu/v1/x.proto -> apis/fgpu/v1/x_pb2.py, x_pb2.pyi, x_pb2_grpc.py.
# Usage: hack/update-proto.sh [OUTDIR]   (OUTDIR defaults to apis; verify-proto.sh uses a temp dir)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/apis}
py=${PYTHON:-python3}
if [ -x "$root/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then py="$root/.venv/bin/python"; fi
cd "$root/proto"
mapfile -t protos < <(find . -name '*.proto' | sed 's|^\./||' | sort)
mkdir -p "$out"
"$py" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "${protos[@]}"
# protoc writes imports relative to the proto root ("from fgpu.v1 import x_pb2");
# the generated code lives inside the apis package, so rewrite them.
tops=$(find . -mindepth 1 -maxdepth 1 -type d | sed 's|^\./||')
for d in $(cd "$out" && find . -name '*.py' -o -name '*.pyi' | sed 's|^\./||'); do
  for t in $tops; do
    sed -i -E "s/^from ${t}(\.[A-Za-z0-9_.]+)? import /from apis.${t}\1 import /" "$out/$d"
  done
done
# packages, so `import apis.fgpu.v1.hooks_pb2` works
find "$out" -mindepth 1 -type d | while read -r dir; do [ -f "$dir/__init__.py" ] || : > "$dir/__init__.py"; done

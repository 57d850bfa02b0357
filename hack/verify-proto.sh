#!/usr/bin/env bash
# Fails when the generated code committed under apis/ is not what proto/ produces.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$root/hack/update-proto.sh" "$tmp"
status=0
while IFS= read -r f; do
  rel=${f#"$tmp"/}
  if ! cmp -s "$f" "$root/apis/$rel"; then
    echo "stale generated file: apis/$rel (run hack/update-proto.sh)" >&2
    status=1
  fi
done < <(find "$tmp" -name '*_pb2*')
# A generated file whose .proto is gone is stale too.
while IFS= read -r f; do
  rel=${f#"$root/apis/"}
  if [ ! -e "$tmp/$rel" ]; then
    echo "orphaned generated file: apis/$rel has no .proto under proto/ (delete it, or restore its .proto)" >&2
    status=1
  fi
done < <(find "$root/apis" -name '*_pb2*' -not -path '*/__pycache__/*')
exit $status

#!/usr/bin/env bash
# Generates the Python stubs of Tally's API (api/proto/tally/v1/*.proto) into
# examples/python/gen/ (git-ignored): gen/tally/v1/{common,budget,admin}_pb2{,_grpc}.py.
# Run it with the Python that has grpcio-tools installed (see requirements.txt), e.g.
#   PYTHON=.venv/bin/python examples/python/generate.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto_root="$here/../../api/proto"
out="$here/gen"
python="${PYTHON:-python3}"
rm -rf "$out"
mkdir -p "$out"
# raft.proto is the nodes' internal service: clients need common, budget and admin.
"$python" -m grpc_tools.protoc \
  -I "$proto_root" \
  --python_out="$out" \
  --grpc_python_out="$out" \
  "$proto_root/tally/v1/common.proto" \
  "$proto_root/tally/v1/budget.proto" \
  "$proto_root/tally/v1/admin.proto"
echo "generated $(find "$out" -name '*.py' | wc -l) stub files in $out"

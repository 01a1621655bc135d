#!/usr/bin/env bash
# Regenerate api_pb2.py, api_pb2.pyi and api_pb2_grpc.py from api.proto with grpcio-tools (a dev
# dependency). Run from anywhere: `bash services/telemetry/src/tessera/telemetry/adapters/podresources/regenerate.sh`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$(cd "$here/../../../.." && pwd)"  # services/telemetry/src
root="$(cd "$src/../../.." && pwd)"
cd "$src"
"$root/.venv/bin/python" -m grpc_tools.protoc -I . \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  tessera/telemetry/adapters/podresources/api.proto

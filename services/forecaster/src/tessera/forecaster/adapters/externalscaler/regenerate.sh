#!/usr/bin/env bash
# Regenerates externalscaler_pb2.py, externalscaler_pb2.pyi and externalscaler_pb2_grpc.py from
# externalscaler.proto (grpcio-tools is a dev dependency). Run from anywhere.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../../../../.." && pwd)"
cd "$here"
"$root/.venv/bin/python" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. externalscaler.proto
# the generated module imports its sibling as a top-level module; make it relative to this package
sed -i 's/^import externalscaler_pb2 as/from . import externalscaler_pb2 as/' externalscaler_pb2_grpc.py
# generated code: not ours to lint or type-check
for f in externalscaler_pb2.py externalscaler_pb2.pyi externalscaler_pb2_grpc.py; do
  sed -i '1i # mypy: ignore-errors\n# ruff: noqa' "$f"
done

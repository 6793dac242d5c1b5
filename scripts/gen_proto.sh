#!/bin/sh
# Regenerate agent/gossip/drl_pb2.py from agent/gossip/drl.proto.
#
#   scripts/gen_proto.sh            # writes agent/gossip/drl_pb2.py
#   scripts/gen_proto.sh OUTDIR     # writes OUTDIR/drl_pb2.py (tests/unit/gossip/test_wire.py compares)
#
# Needs grpcio-tools==1.85.1 (bundles protoc 35.1, whose output the protobuf 7.x
# runtime accepts); PYTHON picks the interpreter (default: the repo's .venv).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
out=${1:-$root/agent/gossip}
if ! "$python" -c 'import grpc_tools.protoc' 2>/dev/null; then
    echo "error: grpc_tools not importable by $python; pip install grpcio-tools==1.85.1" >&2
    exit 1
fi
"$python" -m grpc_tools.protoc -I"$root/agent/gossip" --python_out="$out" "$root/agent/gossip/drl.proto"

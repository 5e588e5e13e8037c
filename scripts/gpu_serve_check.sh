#!/usr/bin/env bash
# The one GPU check of serving (an H200 with no internet; the lead runs it once):
#   1. here: bash scripts/pack_gpu_bundle.sh            -> .device/flint_gpu_bundle.tar.xz (41 MiB)
#   2. there: bash scripts/gpu_serve_check.sh [--preset flint-small|flint-tiny] [--tokens 128]
#             [--kernel-backend triton|torch] [--bundle .device/flint_gpu_bundle.tar.xz]
#      (device tool: carry=[".device/flint_gpu_bundle.tar.xz"]; results land in $OUT)
# It unpacks the bundle (tritonserver 2.51 + the Python 3.12 stub, numpy 1.26.4 and gguf wheels),
# makes a venv that sees the image's torch / triton / transformers with numpy 1.26 in front (the
# 2.51 stub needs numpy<2; the image has 2.5.2), writes a random-weight checkpoint, times the
# engine's decode step in-process at batch 1, then serves the same repository with the engine on
# cuda and times the inter-token latency of a greedy stream through tritonserver. Prints a table,
# writes $OUT/gpu_serve_check.json (or build/gpu_serve_check/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=.device/flint_gpu_bundle.tar.xz PRESET=flint-small TOKENS=128 BACKEND=triton
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --preset) PRESET=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --kernel-backend) BACKEND=$2; shift 2 ;;
    *) echo "gpu_serve_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
RESULTS=${OUT:-build/gpu_serve_check}
mkdir -p "$RESULTS"
step() { echo; echo "== $*"; }

# shellcheck source=scripts/gpu_bundle_venv.sh
source scripts/gpu_bundle_venv.sh "$BUNDLE"

CKPT=build/gpu_ckpt/$PRESET
step "checkpoint $CKPT"
[ -f "$CKPT/config.json" ] || "$VPY" scripts/make_checkpoint.py --preset "$PRESET" --out "$CKPT" --shard-size 2GB

REPO=build/gpu_repo
step "configure $REPO (cuda, $BACKEND kernels)"
rm -rf "$REPO" && cp -r model_repository "$REPO"
"$VPY" scripts/configure_repository.py --repository "$REPO" --model "$CKPT" --device cuda --dtype bfloat16 \
  --kernel-backend "$BACKEND" --max-num-seqs 8 --max-model-len 4096 --kv-cache-memory-fraction 0.5

step "engine alone, batch 1"
"$VPY" scripts/gpu_serve_check.py engine --repository "$REPO" --tokens "$TOKENS" --out "$RESULTS/engine.json"

step "tritonserver"
"$VPY" -m flint_backend.serving.launch --model-repository "$REPO" --http-port 18000 --grpc-port 18001 \
  --metrics-port 18002 -- --exit-timeout-secs=10 > "$RESULTS/tritonserver.log" 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  "$VPY" -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:18000/v2/health/ready", timeout=2)' \
    2>/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { tail -50 "$RESULTS/tritonserver.log"; exit 1; }
  sleep 1
done
"$VPY" scripts/gpu_serve_check.py client --url 127.0.0.1:18000 --metrics-url 127.0.0.1:18002 \
  --tokens "$TOKENS" --out "$RESULTS/client.json"

step "result"
"$VPY" scripts/gpu_serve_check.py report "$RESULTS/engine.json" "$RESULTS/client.json" --out "$RESULTS/gpu_serve_check.json"

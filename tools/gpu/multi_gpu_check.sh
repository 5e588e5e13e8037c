#!/usr/bin/env bash
# Scale-out check on a machine with >= 2 GPUs (not run on the CPU machines; see README "Scale-out"):
#   1. here: bash tools/gpu/pack_gpu_bundle.sh            -> .device/flint_gpu_bundle.tar.xz
#   2. there: bash tools/gpu/multi_gpu_check.sh [--gpus 0,1] [--streams 64] [--tokens 128]
#             [--preset flint-small] [--kernel-backend triton] [--bundle .device/flint_gpu_bundle.tar.xz]
#             [--no-bundle]   (the image's tritonserver and python3 instead of the bundle)
#      (device tool: kind nvidia-h200-x2, carry=[".device/flint_gpu_bundle.tar.xz"]; results in $OUT)
# Serves one checkpoint twice: flint_model on the first GPU only (--gpus 0), then one instance per
# GPU (--gpus 0,1: KIND_GPU, each engine with its own KV pool on its own device). Each time it
# sends --streams concurrent greedy streams of --tokens tokens through the `flint` ensemble and
# records throughput, TTFT, the tokens each instance generated (/metrics, label `instance`: both
# must be busy) and per-GPU memory (nvidia-smi: after loading and peak). Prints a table, writes
# $OUT/multi_gpu_check.json (or build/multi_gpu_check/). Fails when an instance served nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/wait_server_ready.sh
source scripts/wait_server_ready.sh
BUNDLE=.device/flint_gpu_bundle.tar.xz PRESET=flint-small TOKENS=128 STREAMS=64 BACKEND=triton GPUS=0,1
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --no-bundle) BUNDLE=; shift ;;
    --gpus) GPUS=$2; shift 2 ;;
    --preset) PRESET=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --streams) STREAMS=$2; shift 2 ;;
    --kernel-backend) BACKEND=$2; shift 2 ;;
    *) echo "multi_gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
RESULTS=${OUT:-build/multi_gpu_check}
mkdir -p "$RESULTS"
step() { echo; echo "== $*"; }

NGPUS=$(nvidia-smi --list-gpus | wc -l)
IFS=, read -r -a WANTED <<< "$GPUS"
[ "${#WANTED[@]}" -ge 2 ] && [ "$NGPUS" -ge "${#WANTED[@]}" ] || {
  echo "multi_gpu_check.sh: needs the GPUs $GPUS (at least two); this machine shows $NGPUS" >&2; exit 1; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv

if [ -n "$BUNDLE" ]; then
  # shellcheck source=tools/gpu/gpu_bundle_venv.sh
  source tools/gpu/gpu_bundle_venv.sh "$BUNDLE"
else
  VPY=$(command -v python3)
  export PYTHONPATH=$PWD
fi

CKPT=build/gpu_ckpt/$PRESET
step "checkpoint $CKPT"
[ -f "$CKPT/config.json" ] || "$VPY" scripts/make_checkpoint.py --preset "$PRESET" --out "$CKPT" --shard-size 2GB

SERVER=
stop_server() {
  if [ -n "$SERVER" ]; then kill -INT "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  SERVER=
}
trap stop_server EXIT

serve_and_load() {  # LABEL GPU_LIST
  local label=$1 gpus=$2 repo=build/multi_gpu_repo
  step "$label: flint_model on GPUs $gpus"
  rm -rf "$repo" && cp -r model_repository "$repo"
  # max-num-seqs = STREAMS: one engine alone can batch every stream
  "$VPY" -m flint_backend.serving.configure --repository "$repo" --model "$CKPT" --gpus "$gpus" --dtype bfloat16 \
    --kernel-backend "$BACKEND" --max-num-seqs "$STREAMS" --max-model-len 4096 --kv-cache-memory-fraction 0.5
  "$VPY" -m flint_backend.serving.launch --model-repository "$repo" --http-port 18000 --grpc-port 18001 \
    --metrics-port 18002 -- --exit-timeout-secs=10 > "$RESULTS/tritonserver_$label.log" 2>&1 &
  SERVER=$!
  wait_server_ready "$VPY" "$SERVER" "$RESULTS/tritonserver_$label.log" 900 || exit 1
  grep -o "flint_model: instance [^,]*" "$RESULTS/tritonserver_$label.log" || true
  "$VPY" tools/gpu/multi_gpu_check.py load --url 127.0.0.1:18000 --metrics-url 127.0.0.1:18002 \
    --streams "$STREAMS" --tokens "$TOKENS" --label "$label" --out "$RESULTS/$label.json"
  stop_server
}

serve_and_load one "${WANTED[0]}"
serve_and_load all "$GPUS"

step "result"
"$VPY" tools/gpu/multi_gpu_check.py report "$RESULTS/one.json" "$RESULTS/all.json" --out "$RESULTS/multi_gpu_check.json"
"$VPY" - "$RESULTS/all.json" "${#WANTED[@]}" <<'PY'
import json, sys
run, wanted = json.load(open(sys.argv[1])), int(sys.argv[2])
busy = {k: v for k, v in run["instance_tokens"].items() if v > 0}
assert len(busy) == wanted, f"expected {wanted} busy flint_model instances, got {run['instance_tokens']}"
print(f"every instance served traffic: {busy}")
PY

#!/usr/bin/env bash
# The GPU check of serving at batch 1 (an H200 with no internet; the lead runs it):
#   1. here: bash tools/gpu/pack_gpu_bundle.sh            -> .device/flint_gpu_bundle.tar.xz (41 MiB)
#   2. there: bash tools/gpu/gpu_serve_check.sh [--cases ckpt:flint-tiny,random:flint-40b,random:flint-40b:nvfp4]
#             [--tokens 128] [--prompt-tokens 1000] [--max-model-len 8192] [--max-num-seqs 1] [--runs 3]
#             [--kernel-backend triton] [--device cuda] [--bundle .device/flint_gpu_bundle.tar.xz | --no-bundle]
#             [--deadline-s 530] [--concurrency N] [--target 0.9] [--serve-args "CONFIGURE FLAGS"]
#      (device tool: carry=[".device/flint_gpu_bundle.tar.xz"]; results land in $OUT)
# --concurrency N: the concurrency mode (tools/gpu/serve_concurrency.py) instead of batch 1: N
# different prompts of --prompt-tokens tokens, --tokens greedy tokens each, all submitted at once,
# in-process and then through tritonserver (flint_model with token ids, the flint ensemble with
# text, N streaming clients); output tok/s, TTFT and ITL percentiles side by side, the served /
# in-process ratio, each server process's CPU ms per token; exit status 1 below --target (0.9).
# The repository gets max-num-seqs N, max-model-len prompt + tokens (rounded up to 64), a block pool
# that holds all N, and no prefix caching (the runs send the same prompts one after another).
# --serve-args: more flags for flint_backend.serving.configure, e.g. "--cpu-threads 1" (a CPU dry run:
# leave a core to the server's other processes) or "--response-busy-fraction 0" (a response a step).
# It unpacks the bundle (tritonserver 2.51 + the Python 3.12 stub, numpy 1.26.4 and gguf wheels) into
# a venv that sees the image's torch / triton / transformers with numpy 1.26 in front (the 2.51 stub
# needs numpy<2; the image has 2.5.2). Then, per case:
#   ckpt:PRESET              writes a random-weight checkpoint of PRESET and serves it from disk;
#   random:PRESET[:nvfp4]    no checkpoint: the engine builds random weights of PRESET on the GPU at
#                            load (the full-size flint-40b is 80 GB in bf16, more than the disk takes);
#                            nvfp4 quantises them as it goes (W4A16, ~23 GB);
# configures a copy of model_repository (CUDA graphs and the decode path the engine defaults pick,
# both reported; max-num-seqs 1: the check runs batch 1 only, and each larger CUDA-graph
# bucket would add capture and kernel-compile time), times the engine's decode step in-process at
# batch 1, synced and, as bench.py does, unsynced (its own process, which exits first: one 80 GB
# model on the GPU at a time), serves the
# same repository and streams the same greedy request through tritonserver (flint_model with token
# ids, and the flint ensemble with text), and compares the served tokens and text with the engine's.
# Prints a table per case and a summary, writes $OUT/<date>-<commit>-serve-check.json (the name
# benchmarks/<gpu>/ keeps it by; without $OUT, under build/gpu_serve_check/),
# the run's log and each server's log. A case is skipped when fewer than 150 s are left before
# --deadline-s; a failed case does not stop the next. Exit status 1 if a case failed, was skipped,
# or served other tokens.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=.device/flint_gpu_bundle.tar.xz CASES=ckpt:flint-tiny,random:flint-40b,random:flint-40b:nvfp4
TOKENS=128 PROMPT=1000 MAXLEN='' SEQS='' RUNS=3 BACKEND=triton DEVICE=cuda DEADLINE=530 CONCURRENCY='' TARGET=0.9
ENGINE_FLAGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2 ;;
    --no-bundle) BUNDLE=; shift ;;
    --cases) CASES=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --prompt-tokens) PROMPT=$2; shift 2 ;;
    --max-model-len) MAXLEN=$2; shift 2 ;;
    --max-num-seqs) SEQS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --kernel-backend) BACKEND=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    --deadline-s) DEADLINE=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --target) TARGET=$2; shift 2 ;;
    --serve-args) read -r -a MORE <<< "$2"; ENGINE_FLAGS+=("${MORE[@]}"); shift 2 ;;
    *) echo "gpu_serve_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "$CONCURRENCY" ]; then
  SEQS=${SEQS:-$CONCURRENCY} MAXLEN=${MAXLEN:-$(( (PROMPT + TOKENS + 63) / 64 * 64 ))}
  ENGINE_FLAGS+=(--no-enable-prefix-caching)
fi
SEQS=${SEQS:-1} MAXLEN=${MAXLEN:-8192}
RESULTS=${OUT:-build/gpu_serve_check}
SUMMARY=$RESULTS/$(date -u +%F)-${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo nocommit)}-serve-check${CONCURRENCY:+-c$CONCURRENCY}.json
WORK=build/gpu_serve_check_work
mkdir -p "$RESULTS" "$WORK"
exec > >(tee "$RESULTS/gpu_serve_check.log") 2>&1
step() { echo; echo "== [$SECONDS s] $*"; }
export PYTHONUNBUFFERED=1
# shellcheck source=scripts/wait_server_ready.sh
source scripts/wait_server_ready.sh

if [ -n "$BUNDLE" ]; then
  # shellcheck source=tools/gpu/gpu_bundle_venv.sh
  source tools/gpu/gpu_bundle_venv.sh "$BUNDLE" "$DEVICE"
else  # the current environment (the Docker image, or a dev venv: PYTHON=.venv/bin/python)
  VPY=$(command -v "${PYTHON:-python3}")
  export PYTHONPATH=$PWD
fi
gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
BASE_MIB=0
if [ "$DEVICE" != cpu ]; then
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  BASE_MIB=$(gpu_used_mib)
fi
rm -f "$SUMMARY"

gpu_memory_free() {  # wait (up to 120 s) until the GPU is back to within 2 GiB of its use at the start
  [ "$DEVICE" = cpu ] && return 0
  local used
  for _ in $(seq 120); do
    used=$(gpu_used_mib)
    [ "$used" -lt $((BASE_MIB + 2048)) ] && return 0
    sleep 1
  done
  echo "GPU memory still in use: $used MiB (at the start: $BASE_MIB MiB)" >&2
  return 1
}

run_case() {  # SPEC, in a subshell of its own (set -e holds; the EXIT trap stops this case's server)
  local spec=$1 kind preset quant name repo log server=
  IFS=: read -r kind preset quant <<< "$spec"
  name=${preset}_${quant:-bf16}_$kind
  repo=$WORK/repo_$name
  log=$RESULTS/tritonserver_$name.log
  local weights=()
  case "$kind:$quant" in
    ckpt:)   local ckpt=build/gpu_ckpt/$preset
             step "$name: checkpoint $ckpt"
             [ -f "$ckpt/config.json" ] || "$VPY" scripts/make_checkpoint.py --preset "$preset" --out "$ckpt" --shard-size 2GB
             weights=(--model "$ckpt") ;;
    random:|random:nvfp4) weights=(--preset "$preset" --seed 0 ${quant:+--quantization "$quant"}) ;;
    *) echo "--cases: $spec is not ckpt:PRESET or random:PRESET[:nvfp4]" >&2; return 2 ;;
  esac
  step "$name: configure $repo ($DEVICE, $BACKEND kernels, ${weights[*]})"
  rm -rf "$repo" && cp -r model_repository "$repo"
  "$VPY" -m flint_backend.serving.configure --repository "$repo" "${weights[@]}" --device "$DEVICE" \
    --dtype bfloat16 --kernel-backend "$BACKEND" --max-num-seqs "$SEQS" --max-model-len "$MAXLEN" \
    --block-size 64 --num-kv-blocks $((SEQS * (MAXLEN / 64))) ${ENGINE_FLAGS[@]+"${ENGINE_FLAGS[@]}"}

  gpu_memory_free
  if [ -n "$CONCURRENCY" ]; then
    step "$name: engine alone, $CONCURRENCY streams at once"
    "$VPY" tools/gpu/serve_concurrency.py engine --repository "$repo" --streams "$CONCURRENCY" \
      --prompt-tokens "$PROMPT" --tokens "$TOKENS" --out "$WORK/$name.engine.json"
  else
    step "$name: engine alone, batch 1"
    "$VPY" tools/gpu/gpu_serve_check.py engine --repository "$repo" --prompt-tokens "$PROMPT" --tokens "$TOKENS" \
      --runs "$RUNS" --out "$WORK/$name.engine.json"
  fi

  step "$name: tritonserver"
  gpu_memory_free
  if "$VPY" -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:18000/v2/health/live", timeout=2)' \
      2>/dev/null; then
    echo "port 18000 already answers: another server is running (its answers would be timed)" >&2
    return 1
  fi
  setsid "$VPY" -m flint_backend.serving.launch --model-repository "$repo" --http-port 18000 --grpc-port 18001 \
    --metrics-port 18002 -- --exit-timeout-secs=10 --allow-gpu-metrics=false > "$log" 2>&1 &
  server=$!
  # shellcheck disable=SC2064  # this case's server, now
  trap "kill -INT $server 2>/dev/null || true; wait $server 2>/dev/null || true; kill -KILL -- -$server 2>/dev/null || true" EXIT
  wait_server_ready "$VPY" "$server" "$log" 400 || return 1
  grep -o "flint_model: instance .*" "$log" | cut -c1-400 || true
  step "$name: client"
  if [ -n "$CONCURRENCY" ]; then
    "$VPY" tools/gpu/serve_concurrency.py client --url 127.0.0.1:18000 --engine "$WORK/$name.engine.json" \
      --server-pid "$server" --out "$WORK/$name.client.json"
    "$VPY" tools/gpu/serve_concurrency.py report "$WORK/$name.engine.json" "$WORK/$name.client.json" \
      --case "$name" --into "$SUMMARY" --target "$TARGET"
    return
  fi
  "$VPY" tools/gpu/gpu_serve_check.py client --url 127.0.0.1:18000 --metrics-url 127.0.0.1:18002 \
    --engine "$WORK/$name.engine.json" --runs "$RUNS" --out "$WORK/$name.client.json"
  "$VPY" tools/gpu/gpu_serve_check.py report "$WORK/$name.engine.json" "$WORK/$name.client.json" --case "$name" \
    --into "$SUMMARY"
}

FAILED=
IFS=, read -r -a SPECS <<< "$CASES"
for spec in "${SPECS[@]}"; do
  if [ $((DEADLINE - SECONDS)) -lt 150 ]; then
    echo "== [$SECONDS s] $spec: skipped, fewer than 150 s left before the ${DEADLINE} s deadline"
    FAILED="$FAILED $spec(skipped)"
    continue
  fi
  # a background subshell keeps set -e in force inside it (in `( ... ) || x` bash would ignore it)
  ( set -e; run_case "$spec" ) &
  wait $! || FAILED="$FAILED $spec"
done

step "summary"
if [ -n "$CONCURRENCY" ]; then
  [ -f "$SUMMARY" ] && "$VPY" tools/gpu/serve_concurrency.py summary "$SUMMARY" || true
  [ -z "$FAILED" ] || { echo "failed:$FAILED"; exit 1; }
  echo "every case served at least $TARGET of the in-process output tokens/s"
  exit 0
fi
[ -f "$SUMMARY" ] && "$VPY" tools/gpu/gpu_serve_check.py summary "$SUMMARY" || true
[ -z "$FAILED" ] || { echo "failed:$FAILED"; exit 1; }
echo "all cases served the engine's tokens"

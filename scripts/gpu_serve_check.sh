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
W=build/gpu_bundle
mkdir -p "$RESULTS"
step() { echo; echo "== $*"; }

step "unpack $BUNDLE"
rm -rf "$W" && mkdir -p "$W" && tar -C "$W" -xJf "$BUNDLE"
[ "$(cat "$W/ARCH")" = "$(uname -m)" ] || { echo "bundle is for $(cat "$W/ARCH"), this is $(uname -m)" >&2; exit 1; }

step "venv over the image's packages, numpy 1.26 in front"
python3 -m venv --without-pip --system-site-packages "$W/venv"
VPY=$PWD/$W/venv/bin/python
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m pip install -q --no-index --no-deps --target "$SITE" "$W"/wheels/*.whl
cp -r "$W/pytriton" "$W/nvidia_pytriton.libs" "$SITE/"
ln -sfn "$PWD/kernels" "$SITE/flint_kernels"
export PYTHONPATH=$PWD
"$VPY" - <<'PY'
import sys, sysconfig, os
import numpy, torch, triton, transformers
v = f"{sys.version_info[0]}.{sys.version_info[1]}"
lib = os.path.join(sysconfig.get_config_var("LIBDIR") or "", f"libpython{v}.so.1.0")
print(f"python {sys.version.split()[0]} numpy {numpy.__version__} torch {torch.__version__} triton {triton.__version__} "
      f"transformers {transformers.__version__} cuda {torch.cuda.is_available()} libpython {os.path.exists(lib)}")
assert numpy.__version__.startswith("1."), "numpy 1.26 must win in the stub's environment"
assert v == "3.12", f"the bundle has the stub for Python 3.12, not {v}"
assert torch.cuda.is_available(), "no CUDA GPU"
if not os.path.exists(lib):
    import ctypes.util
    assert ctypes.util.find_library(f"python{v}"), f"libpython{v}.so is missing: the Python backend stub links it"
PY

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

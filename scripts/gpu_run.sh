#!/usr/bin/env bash
# One device call: correctness on the GPU (pytest -m gpu) and the kernel benchmarks, logs under $OUT.
#   run(command="bash scripts/gpu_run.sh [tests|kernels|ops|bench ARGS...]", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
what=${1:-tests}; shift || true
case "$what" in
  tests)    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
            # SIGINT at the deadline: pytest stops like on ^C and still prints its failures and summary
            # (a KILL would cut the log before them); -v: the log names every test that ran
            timeout -s INT -k 20 "${TEST_TIMEOUT:-480}" python3 -m pytest -m gpu -v -rfE -p no:cacheprovider \
              --durations=10 "$@" tests > "$OUT/gpu_tests.log" 2>&1
            grep -E "FAILED|ERROR|^E  " "$OUT/gpu_tests.log" | head -40; tail -15 "$OUT/gpu_tests.log" ;;
  kernels)  timeout "${BENCH_TIMEOUT:-400}" python3 scripts/bench_kernels.py --out "$OUT/kernels-h200.json" "$@" 2>&1 | tee "$OUT/bench_kernels.log" | tail -60 ;;
  ops)      python3 scripts/bench_decode_ops.py --out "$OUT/decode-ops-h200.json" "$@" 2>&1 | tee "$OUT/ops.log" | tail -30 ;;
  bench)    python3 scripts/bench.py --out "$OUT/results.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60 ;;
  *)        echo "usage: gpu_run.sh tests|kernels|ops|bench [args]"; exit 2 ;;
esac

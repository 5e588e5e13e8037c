#!/usr/bin/env bash
# Nsight Compute on the kernels of one replayed batch-1 decode step (flint-40b, random weights):
# where a latency-bound launch's warps wait (WarpStateStats), its occupancy and memory traffic.
#   run(command="bash scripts/ncu_step.sh [FORMAT [CONTEXT [SKIP [COUNT]]]]", carry=[".whl"])
# FORMAT nvfp4 (default) or bf16, CONTEXT 100000. SKIP/COUNT pick kernels of the profiled replay
# in launch order: the default 15/16 are layers 2 (sliding, MoE) and 3 (full, MoE) of a step
# whose dense layers take 7 launches each after the embedding (qkv, qk_norm_rope, split, reduce,
# o_proj, gate/up, down: ops.SILU_IN_DOWN); 17 with FLINT_SILU_IN_DOWN=0. Each kernel runs
# alone under ncu (no PDL overlap), L2 and clocks left as they are. Writes $OUT/ncu-step.ncu-rep
# and its details as text ($OUT/ncu-step.txt); prints each kernel's name and duration.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
fmt=${1:-nvfp4}; context=${2:-100000}; skip=${3:-15}; count=${4:-16}
NCU=${NCU:-$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)}
if [ -z "$NCU" ]; then echo "ncu not found (set NCU)"; exit 2; fi
"$NCU" --profile-from-start off --graph-profiling node --launch-skip "$skip" --launch-count "$count" \
  --cache-control none --clock-control none \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis \
  -f -o "$OUT/ncu-step" \
  python3 -m scripts.bench_step_timeline --formats "$fmt" --context "$context" --ncu \
    --out "$OUT/ncu-step-meta.json" > "$OUT/ncu-run.log" 2>&1
rc=$?
tail -5 "$OUT/ncu-run.log"
"$NCU" --import "$OUT/ncu-step.ncu-rep" --page details > "$OUT/ncu-step.txt" 2>&1
grep -E "^  [_a-zA-Z].*\(|Duration  " "$OUT/ncu-step.txt" | head -80
exit $rc

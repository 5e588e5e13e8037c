#!/usr/bin/env bash
# One device call: correctness on the GPU (pytest -m gpu), the kernel benchmarks or a profile, logs under $OUT.
#   run(command="bash tools/gpu/gpu_run.sh [tests|kernels|ops|bench|sweep|tools|prefix|timeline|ncu ARGS...]", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# JSON results as benchmarks/<gpu>/ keeps them: <date>-<commit>-<what>.json (GIT_COMMIT where the tree has no .git)
STAMP=$(date -u +%F)-${GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo nocommit)}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
what=${1:-tests}; shift || true
case "$what" in
  tests)    nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
            # SIGINT at the deadline: pytest stops like on ^C and still prints its failures and summary
            # (a KILL would cut the log before them); -v: the log names every test that ran; the GPU
            # tests live in tests/kernels and tests/engine (the image lacks pydantic, which
            # tests/openai imports at collection)
            timeout -s INT -k 20 "${TEST_TIMEOUT:-480}" python3 -m pytest -m gpu -v -rfE -p no:cacheprovider \
              --durations=10 "$@" tests/kernels tests/engine > "$OUT/gpu_tests.log" 2>&1
            grep -E "FAILED|ERROR|^E  " "$OUT/gpu_tests.log" | head -40; tail -15 "$OUT/gpu_tests.log" ;;
  kernels)  timeout "${BENCH_TIMEOUT:-400}" python3 tools/bench/bench_kernels.py --out "$OUT/$STAMP-kernels.json" "$@" 2>&1 | tee "$OUT/bench_kernels.log" | tail -60 ;;
  ops)      python3 tools/bench/bench_decode_ops.py --out "$OUT/$STAMP-decode-ops.json" "$@" 2>&1 | tee "$OUT/ops.log" | tail -30 ;;
  bench)    python3 tools/bench/bench.py --out "$OUT/$STAMP-bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60 ;;
  # launch shapes against each other, e.g. sweep --only prefill_attention; sweep --only moe --tokens 8192
  sweep)    python3 tools/bench/sweep_tiles.py --out "$OUT/$STAMP-sweep-tiles.json" "$@" 2>&1 | grep -vi warn | tee "$OUT/sweep.log" | tail -80 ;;
  # the tool-call grammar's cost a step; .whl must hold xgrammar, apache-tvm-ffi, pydantic,
  # pydantic-core, annotated-types and typing-inspection (the image has none of them)
  tools)    python3 tools/bench/bench_tool_constraint.py --device cuda --out "$OUT/$STAMP-tool-constraint.json" "$@" \
              2>&1 | tee "$OUT/tool-constraint.log" | tail -12 ;;
  # multi-turn agent sessions, prefix caching on against off (flint-40b NVFP4 by default)
  prefix)   python3 tools/bench/bench_prefix_cache.py --quantization nvfp4 --out "$OUT/$STAMP-prefix-cache.json" "$@" \
              2>&1 | tee "$OUT/prefix-cache.log" | tail -30 ;;
  # Paired graph replays of one batch-1 decode step and their per-kernel critical path, main's
  # defaults first: timeline FORMATS CONTEXT [VARIANT...], each VARIANT module.ATTR=value[,...]
  # (tools/bench/bench_step_timeline.py --variant), e.g.
  #   timeline nvfp4,bf16 100000 flint_kernels.dense_gemv.ROW_RSTD_FROM_STEPS=0
  timeline) formats=${1:-nvfp4,bf16}; context=${2:-100000}; shift 2 || shift $#
            variants=(); for v in "$@"; do variants+=(--variant "$v"); done
            # TIMELINE_ARGS: more flags, e.g. "--layers 28" (flint-40b's first 28 layers: BF16 on an H100)
            python3 -m tools.bench.bench_step_timeline --formats "$formats" --context "$context" "${variants[@]}" ${TIMELINE_ARGS:-} \
              --out "$OUT/$STAMP-timeline.json" 2>&1 | tee "$OUT/timeline.log" | grep -E "replay|^\| \*\*|^###" | tail -40 ;;
  # Nsight Compute on the kernels of one replayed batch-1 decode step (flint-40b, random weights):
  # ncu [FORMAT [CONTEXT [SKIP [COUNT]]]], FORMAT nvfp4 (default) or bf16, CONTEXT 100000. SKIP
  # and COUNT pick kernels of the profiled replay in launch order: 15 and 16 are layers 2 (sliding,
  # MoE) and 3 (full, MoE) when the dense layers take 7 launches each after the embedding (qkv,
  # qk_norm_rope, split, reduce, o_proj, gate/up, down: NVFP4, whose down applies the SwiGLU,
  # ops.silu_linear; 17 for BF16, whose dense layers run silu_mul). Each
  # kernel runs alone (no PDL overlap), L2 and clocks as they are; sections: where the warps wait
  # (WarpStateStats), occupancy, memory traffic. $OUT/ncu-step.ncu-rep and its details as text.
  ncu)      ncu=${NCU:-$(command -v ncu || ls -d /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)}
            [ -n "$ncu" ] || { echo "ncu not found (set NCU)"; exit 2; }
            "$ncu" --profile-from-start off --graph-profiling node --launch-skip "${3:-15}" \
              --launch-count "${4:-16}" --cache-control none --clock-control none \
              --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
              --section SchedulerStats --section MemoryWorkloadAnalysis -f -o "$OUT/ncu-step" \
              python3 -m tools.bench.bench_step_timeline --formats "${1:-nvfp4}" --context "${2:-100000}" --ncu \
                --out "$OUT/$STAMP-ncu-step-meta.json" > "$OUT/ncu-run.log" 2>&1
            tail -5 "$OUT/ncu-run.log"
            "$ncu" --import "$OUT/ncu-step.ncu-rep" --page details > "$OUT/ncu-step.txt" 2>&1
            grep -E "^  [_a-zA-Z].*\(|Duration  " "$OUT/ncu-step.txt" | head -80 ;;
  *)        echo "usage: gpu_run.sh tests|kernels|ops|bench|tools|prefix|timeline|ncu [args]"; exit 2 ;;
esac

#!/usr/bin/env bash
# Load-test the `flint` ensemble of a running server: perf_analyzer over gRPC with --streaming,
# one run per concurrency, then genai-perf (when installed; --backend tensorrtllm and vllm) for
# token-level latencies (TTFT, inter-token latency; it counts tokens by re-tokenising with --tokenizer).
# After the perf_analyzer runs it prints, per concurrency, output tokens/s, TTFT and ITL p50 / p90 /
# p99 from perf_analyzer's own profile export (scripts/loadtest_report.py: every response's arrival
# and the num_output_tokens the ensemble sends in it), counted as the serve check counts them. The
# in-process engine's figure on the same kind of requests comes from the serve check's concurrency
# mode, which puts both side by side: tools/gpu/gpu_serve_check.sh --concurrency N --prompt-tokens P
# --tokens T (docs/performance.md, "Many streams: served through tritonserver").
#
#   scripts/loadtest.sh [--url localhost:8001] [--concurrency "1 2 4 8"] [--max-tokens 128]
#                       [--prompt-words 64] [--requests 32] [--out build/loadtest]
#                       [--tokenizer checkpoints/flint-tiny] [--genai-perf PATH] [--no-genai-perf]
#
# No venv needs to be active: the Python is $PYTHON, else the checkout's .venv (scripts/../.venv),
# else python3; perf_analyzer is that Python's (tritonclient's manylinux wheels,
# 2.51.0, bring it), else the one on PATH. perf_analyzer needs a libcudart.so.12, even without a GPU:
# LD_LIBRARY_PATH gets that Python's nvidia-cuda-runtime-cu12 lib folder; and Debian's libb64-0d
# (apt-get install libb64-0d), which no wheel brings: the script says so when it is missing.
# genai-perf (numpy 2: best in its own venv) is --genai-perf PATH, else on PATH, else in that
# Python's bin; it runs the perf_analyzer found here, with the same library path. Output, under --out:
# per concurrency a CSV (perf_analyzer -f) and a profile export (perf_analyzer_cN.json), the summary
# table as loadtest_summary.json, and genai-perf's artifacts. Exits non-zero when a run fails.
set -euo pipefail

URL=localhost:8001 CONCURRENCY="1 2 4 8" MAX_TOKENS=128 PROMPT_WORDS=64 REQUESTS=32 OUT=build/loadtest
TOKENIZER=checkpoints/flint-tiny GENAI_PERF=1 GENAI_PERF_BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --url) URL=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --prompt-words) PROMPT_WORDS=$2; shift 2 ;;
    --requests) REQUESTS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --tokenizer) TOKENIZER=$2; shift 2 ;;
    --genai-perf) GENAI_PERF_BIN=$2; shift 2 ;;
    --no-genai-perf) GENAI_PERF=0; shift ;;
    *) echo "loadtest.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  PYTHON=$ROOT/.venv/bin/python
  [ -x "$PYTHON" ] || PYTHON=$(command -v python3)
fi
BIN=$(dirname "$PYTHON")
PERF_ANALYZER=$BIN/perf_analyzer
[ -x "$PERF_ANALYZER" ] || PERF_ANALYZER=$(command -v perf_analyzer || true)
[ -x "$PERF_ANALYZER" ] || { echo "loadtest.sh: no perf_analyzer in $BIN or on PATH (PYTHON=$PYTHON): make serve installs it into .venv, or pip install 'tritonclient[all]==2.51.0'" >&2; exit 1; }
CUDART=$("$PYTHON" -c 'import nvidia.cuda_runtime as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${CUDART:+$CUDART:}${LD_LIBRARY_PATH:-}"
PATH="$(dirname "$PERF_ANALYZER"):$PATH"  # genai-perf runs the perf_analyzer on PATH
export PATH
MISSING=$(ldd "$PERF_ANALYZER" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
if [ -n "$MISSING" ]; then
  echo "loadtest.sh: $PERF_ANALYZER cannot find $MISSING" >&2
  case "$MISSING" in *libb64*) echo "  libb64.so.0d: apt-get install libb64-0d (Debian, Ubuntu)" >&2 ;; esac
  case "$MISSING" in *libcudart*) echo "  libcudart.so.12: $PYTHON -m pip install nvidia-cuda-runtime-cu12" >&2 ;; esac
  exit 1
fi
mkdir -p "$OUT"

# one streamed request, as genai-perf --backend tensorrtllm sends it (perf_analyzer adds the batch dimension)
"$PYTHON" - "$OUT/input.json" "$PROMPT_WORDS" "$MAX_TOKENS" <<'PY'
import json, sys
path, words, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * (words // 9 + 1)).split()[:words]
json.dump({"data": [{"text_input": [" ".join(prompt)], "max_tokens": [max_tokens], "stream": [True],
                     "ignore_eos": [True]}]}, open(path, "w"))
PY

for c in $CONCURRENCY; do
  echo "== perf_analyzer: concurrency $c, $MAX_TOKENS tokens per request"
  "$PERF_ANALYZER" -m flint -i grpc --streaming -u "$URL" --input-data "$OUT/input.json" \
    --concurrency-range "$c:$c" --measurement-mode count_windows --measurement-request-count "$REQUESTS" \
    --stability-percentage 999 --max-trials 3 -f "$OUT/perf_analyzer_c$c.csv" \
    --profile-export-file "$OUT/perf_analyzer_c$c.json"
done
EXPORTS=()
for c in $CONCURRENCY; do EXPORTS+=("$OUT/perf_analyzer_c$c.json"); done
echo "== output tokens/s, TTFT and ITL by concurrency (perf_analyzer's profile export; ms)"
"$PYTHON" "$ROOT/scripts/loadtest_report.py" "${EXPORTS[@]}" --json "$OUT/loadtest_summary.json"

[ -n "$GENAI_PERF_BIN" ] || GENAI_PERF_BIN=$(command -v genai-perf || echo "$BIN/genai-perf")
if [ "$GENAI_PERF" = 1 ] && [ -x "$GENAI_PERF_BIN" ]; then
  # genai-perf >= 0.0.14 names Triton's KServe API `--endpoint-type kserve`, older ones `--service-kind triton`.
  # No --warmup-request-count: perf_analyzer 2.51 never finishes its warm-up against decoupled models.
  KIND=(--endpoint-type kserve)
  "$GENAI_PERF_BIN" profile --help 2>/dev/null | grep -q -- "--service-kind" && KIND=(--service-kind triton)
  for backend in tensorrtllm vllm; do
    for c in $CONCURRENCY; do
      echo "== genai-perf --backend $backend: concurrency $c"
      "$GENAI_PERF_BIN" profile -m flint "${KIND[@]}" --backend "$backend" --streaming -u "$URL" \
        --tokenizer "$TOKENIZER" --concurrency "$c" --num-prompts "$REQUESTS" --request-count "$REQUESTS" \
        --synthetic-input-tokens-mean "$PROMPT_WORDS" --output-tokens-mean "$MAX_TOKENS" \
        --output-tokens-mean-deterministic --extra-inputs ignore_eos:true \
        --artifact-dir "$OUT/genai_perf_${backend}_c$c"
    done
  done
elif [ "$GENAI_PERF" = 1 ]; then
  echo "genai-perf not found: skipped (pip install genai-perf, best in its own venv, then --genai-perf VENV/bin/genai-perf)"
fi

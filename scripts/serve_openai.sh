#!/usr/bin/env bash
# tritonserver on a configured model repository (in the background) + the OpenAI-compatible server
# in front of it (in the foreground); stopping one stops both. `make serve-openai` runs this.
#
#   scripts/serve_openai.sh [OpenAI server flags: --port 9000 --enable-auto-tool-choice ... --api-key KEY]
#
# Environment: PYTHON (.venv/bin/python), REPOSITORY (model_repository), HTTP_PORT, GRPC_PORT,
# METRICS_PORT (8000 8001 8002). The OpenAI server answers 503 until Triton is ready (GET /health).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
GRPC_PORT=${GRPC_PORT:-8001}
METRICS_PORT=${METRICS_PORT:-8002}

"$PY" -m flint_backend.serving.launch --model-repository "${REPOSITORY:-model_repository}" \
  --http-port "${HTTP_PORT:-8000}" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" &
triton=$!
stop_triton() {
  kill -INT "$triton" 2>/dev/null || true
  wait "$triton" 2>/dev/null || true
}
trap stop_triton EXIT
trap 'exit 130' INT TERM

"$PY" -m flint_backend.openai --triton-url "127.0.0.1:$GRPC_PORT" \
  --triton-metrics-url "http://127.0.0.1:$METRICS_PORT/metrics" "$@" &
openai=$!
# whichever stops first ends the other (the EXIT trap stops tritonserver)
wait -n "$triton" "$openai" || status=$?
kill -INT "$openai" 2>/dev/null || true
wait "$openai" 2>/dev/null || true
exit "${status:-0}"

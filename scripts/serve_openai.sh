#!/usr/bin/env bash
# tritonserver on a configured model repository (in the background) + the OpenAI-compatible server
# in front of it; stopping one (or this script: SIGINT, SIGTERM) stops both. `make serve-openai` runs this.
#
#   scripts/serve_openai.sh [OpenAI server flags: --port 9000 --enable-auto-tool-choice ... --api-key KEY]
#
# Environment: PYTHON (.venv/bin/python), REPOSITORY (build/model_repository, where configure
# writes), HTTP_PORT, GRPC_PORT, METRICS_PORT (8000 8001 8002), ADDRESS (127.0.0.1: what
# tritonserver's three ports bind to; the OpenAI server, which checks the API key, is the front
# door, so Triton is not reachable around it; ADDRESS=0.0.0.0 opens them to every interface).
# The OpenAI server answers 503 until Triton is ready (GET /health). A second SIGINT or SIGTERM
# while stopping kills both at once.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
GRPC_PORT=${GRPC_PORT:-8001}
METRICS_PORT=${METRICS_PORT:-8002}
ADDRESS=${ADDRESS:-127.0.0.1}
case "$ADDRESS" in
  0.0.0.0) TRITON_HOST=127.0.0.1 ;;
  *) TRITON_HOST=$ADDRESS ;;
esac

triton="" openai=""
# shellcheck disable=SC2329  # run by the EXIT trap
stop_all() {
  trap 'kill -KILL $triton $openai 2>/dev/null || true' INT TERM
  for pid in $openai $triton; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in $openai $triton; do wait "$pid" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$PY" -m flint_backend.serving.launch --model-repository "${REPOSITORY:-build/model_repository}" --address "$ADDRESS" \
  --http-port "${HTTP_PORT:-8000}" --grpc-port "$GRPC_PORT" --metrics-port "$METRICS_PORT" &
triton=$!
"$PY" -m flint_backend.openai --triton-url "$TRITON_HOST:$GRPC_PORT" \
  --triton-metrics-url "http://$TRITON_HOST:$METRICS_PORT/metrics" "$@" &
openai=$!
# whichever stops first ends the other (the EXIT trap stops both)
status=0
wait -n "$triton" "$openai" || status=$?
exit "$status"

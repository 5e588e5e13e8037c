#!/usr/bin/env bash
# The image's entrypoint: `MODEL [flags]` -> configure the model repository, start tritonserver.
# The same two steps as `make serve` (python -m flint_backend.serving.configure, then the launcher),
# serving the configured copy build/model_repository.
# TRITONSERVER_ARGS: more tritonserver flags, e.g. "--exit-timeout-secs=100" (let streams in
# flight finish after SIGTERM, as a Kubernetes pod that is scaled down needs). ADDRESS: what the
# ports bind to, all interfaces by default (published ports and the pod's probes reach them so).
set -euo pipefail
cd /opt/flint
if [ "${1:-}" = "--help" ] || [ $# -eq 0 ]; then
  python3 -m flint_backend.serving.configure --help
  exit 0
fi
python3 -m flint_backend.serving.configure "$@"
read -r -a EXTRA <<< "${TRITONSERVER_ARGS:-}"
exec python3 -m flint_backend.serving.launch --model-repository build/model_repository --address "${ADDRESS:-0.0.0.0}" \
  --http-port "${HTTP_PORT:-8000}" --grpc-port "${GRPC_PORT:-8001}" --metrics-port "${METRICS_PORT:-8002}" \
  -- "${EXTRA[@]}"

# shellcheck shell=bash
# wait_server_ready PYTHON PID LOG TRIES: poll tritonserver's HTTP readiness on 127.0.0.1:18000 once a
# second, up to TRIES times; return 1 (after printing the log's tail) if the server process PID has
# exited or it never became ready. Sourced by gpu_serve_check.sh and multi_gpu_check.sh.
wait_server_ready() {
  local py=$1 pid=$2 log=$3 tries=$4
  for _ in $(seq "$tries"); do
    "$py" -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:18000/v2/health/ready", timeout=2)' \
      2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { tail -50 "$log"; return 1; }
    sleep 1
  done
  echo "tritonserver not ready after $tries s" >&2
  tail -50 "$log"
  return 1
}

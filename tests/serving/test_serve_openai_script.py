"""scripts/serve_openai.sh (what `make serve-openai` runs): tritonserver listens on the loopback
only, behind the OpenAI server's key, and SIGTERM to the script stops everything it started."""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from flint_backend.serving.launch import PROJECT_ROOT
from processes import session_processes
from triton_server import START_TIMEOUT, configured_repository, free_port

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("fastapi")
pytestmark = pytest.mark.server


def non_loopback_address() -> str | None:
    try:
        addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((a for a in addresses if ":" not in a and not a.startswith("127.")), None)


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@pytest.fixture(scope="module")
def repository(tiny_checkpoint, tmp_path_factory):
    return configured_repository(tmp_path_factory.mktemp("serve_openai"), "--model", str(tiny_checkpoint),
                                 "--device", "cpu", "--dtype", "float32", "--cpu-threads", "1",
                                 "--max-model-len", "512")


@pytest.fixture
def served(repository, tmp_path):
    """scripts/serve_openai.sh as `make serve-openai` runs it, on free ports, in its own session."""
    ports = {name: free_port() for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "OPENAI_PORT")}
    env = {**os.environ, "PYTHON": str(Path(os.sys.executable)), "REPOSITORY": str(repository),
           **{k: str(v) for k, v in ports.items()}}
    log = open(tmp_path / "serve_openai.log", "wb")
    script = subprocess.Popen([str(PROJECT_ROOT / "scripts" / "serve_openai.sh"), "--port", str(ports["OPENAI_PORT"]),
                               "--api-key", "sk-test"], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while status(f"http://127.0.0.1:{ports['OPENAI_PORT']}/health") != 200:
            assert script.poll() is None, (tmp_path / "serve_openai.log").read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "not ready:\n" + (tmp_path / "serve_openai.log").read_text()[-4000:]
            time.sleep(0.5)
        yield script, ports
    finally:
        for pid in session_processes(script.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        script.wait()
        log.close()


def test_tritonserver_listens_on_the_loopback_only(served):
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine shows no non-loopback IPv4 address (hostname -I)")
    _, ports = served
    for name, port in ports.items():
        assert accepts("127.0.0.1", port), name
        assert not accepts(address, port), f"{name} {port} accepts connections on {address}"


def test_sigterm_to_the_script_stops_tritonserver_and_the_openai_server(served):
    script, _ = served
    started = session_processes(script.pid)
    assert any("tritonserver" in c for c in started.values()) and any("flint_backend.openai" in c
                                                                      for c in started.values()), started
    script.send_signal(signal.SIGTERM)
    script.wait(60)  # tritonserver's graceful exit of an idle server
    deadline = time.monotonic() + 10
    while session_processes(script.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not session_processes(script.pid), f"left running: {session_processes(script.pid)}"

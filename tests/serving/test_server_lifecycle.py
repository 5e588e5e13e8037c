"""The engine's stub does not outlive its tritonserver: killed with SIGKILL mid-stream (no
finalize), or the stub sent SIGTERM, it exits within seconds and takes its shared memory with it."""

import os
import signal
import time
from pathlib import Path

import pytest

from triton_server import Streams, TritonServer, configured_repository

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server

EXIT_WITHIN = 10.0  # seconds: the watchdog polls every 0.5 s; cleanup is bounded at a few seconds


def stub_processes(session: int, model: str = "flint_model") -> dict[int, list[str]]:
    """pid -> argv of the Python backend stubs of `model` in the server's session (not zombies)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...
        if (int(fields[3]) == session and fields[0] != "Z" and "triton_python_backend_stub" in argv[0]
                and any(f"/{model}/" in a for a in argv)):
            found[int(entry.name)] = argv
    return found


def wait_gone(pids, timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = {p for p in alive if _alive(p)}
    return alive


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def server(tiny_checkpoint, tmp_path):
    repo = configured_repository(tmp_path, "--model", str(tiny_checkpoint), "--device", "cpu", "--dtype", "float32",
                                 "--cpu-threads", "1", "--max-model-len", "4096")
    with TritonServer(repo, tmp_path / "tritonserver.log") as s:
        yield s


def start_long_stream(server) -> Streams:
    streams = Streams(server.grpc_url)
    streams.send("long", text_input="Hello world", max_tokens=4000, ignore_eos=True, stream=True)
    deadline = time.monotonic() + 60
    while not streams.results["long"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert streams.results["long"], f"no token streamed; errors {streams.errors}"
    return streams


def test_engine_stub_exits_when_tritonserver_is_killed(server):
    stubs = stub_processes(server.process.pid)
    assert len(stubs) == 1, stubs
    (pid, argv), = stubs.items()
    shm = Path("/dev/shm") / argv[2].lstrip("/")  # the stub's argv: model path, shm region, ...
    assert shm.exists(), argv
    streams = start_long_stream(server)
    try:
        server.process.send_signal(signal.SIGKILL)  # no finalize, no exit timeout
        server.process.wait()
        assert not wait_gone([pid], EXIT_WITHIN), f"flint_model stub {pid} still running {EXIT_WITHIN}s after " \
                                                  f"tritonserver was killed:\n{server.log_tail(3000)}"
        assert not shm.exists(), f"{shm} left behind"
    finally:
        streams.client.close()


def test_engine_stub_exits_on_sigterm(server):
    (pid, argv), = stub_processes(server.process.pid).items()
    streams = start_long_stream(server)
    try:
        os.kill(pid, signal.SIGTERM)
        assert not wait_gone([pid], EXIT_WITHIN), f"flint_model stub {pid} ignored SIGTERM:\n{server.log_tail(3000)}"
    finally:
        streams.client.close()

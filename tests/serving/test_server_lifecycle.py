"""The engine's stub does not outlive its tritonserver: killed with SIGKILL mid-stream (no
finalize), or the stub sent SIGTERM, it exits within seconds and takes its shared memory with it."""

import os
import signal
import time
from pathlib import Path

import pytest

from processes import alive, stub_processes
from triton_server import Streams, TritonServer, configured_repository

pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.server

EXIT_WITHIN = 10.0  # seconds: the watchdog polls every 0.5 s; cleanup is bounded at a few seconds


def wait_gone(pids, timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    remaining = set(pids)
    while remaining and time.monotonic() < deadline:
        time.sleep(0.2)
        remaining = {p for p in remaining if alive(p)}
    return remaining


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
    stubs = stub_processes(server.process.pid, "flint_model")
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
    (pid, argv), = stub_processes(server.process.pid, "flint_model").items()
    streams = start_long_stream(server)
    try:
        os.kill(pid, signal.SIGTERM)
        assert not wait_gone([pid], EXIT_WITHIN), f"flint_model stub {pid} ignored SIGTERM:\n{server.log_tail(3000)}"
    finally:
        streams.client.close()

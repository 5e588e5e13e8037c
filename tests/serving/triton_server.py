"""A real tritonserver on the project's model repository, on free local ports, for tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import numpy as np

from flint_backend.serving.launch import PROJECT_ROOT, server_command

START_TIMEOUT = 240  # seconds: three stubs import torch + transformers on 2 cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def configured_repository(dest: Path, *flags: str) -> Path:
    from flint_backend.serving.configure import main as configure

    repo = dest / "model_repository"
    shutil.copytree(PROJECT_ROOT / "model_repository", repo, ignore=shutil.ignore_patterns("__pycache__"))
    configure([*flags, "--repository", str(repo)])
    return repo


class TritonServer:
    def __init__(self, repository: Path, log_path: Path):
        self.repository, self.log_path = repository, log_path
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "TritonServer":
        command = server_command(self.repository, self.http_port, self.grpc_port, self.metrics_port,
                                 ["--exit-timeout-secs=10", "--allow-gpu-metrics=false"])
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(command.argv, env=command.env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.__exit__()  # its stubs may outlive it
                raise RuntimeError(f"tritonserver exited ({self.process.returncode}):\n{self.log_tail()}")
            if self.ready():
                return self
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"tritonserver not ready after {START_TIMEOUT}s:\n{self.log_tail()}")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        if self.process is not None:
            try:  # our own session: whatever is left of the server and its stubs
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        self._log.close()

    def ready(self) -> bool:
        """Ready for requests and serving /metrics: tritonserver starts its metrics service after
        the HTTP one (tens of ms later), and a test may read /metrics first."""
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                if r.status != 200:
                    return False
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def unreachable(self, error: urllib.error.URLError) -> RuntimeError:
        """A request that found no server: whether it still runs, and what it logged."""
        code = self.process.poll()
        state = "running" if code is None else f"exited ({code})"
        return RuntimeError(f"{error.reason}: tritonserver {state}; its log ends:\n{self.log_tail(3000)}")

    # ---------------------------------------------------------------- HTTP
    def generate(self, body: dict, model: str = "flint") -> tuple[int, dict]:
        request = urllib.request.Request(f"http://{self.http_url}/v2/models/{model}/generate",
                                         data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except urllib.error.URLError as e:
            raise self.unreachable(e) from e

    def generate_stream(self, body: dict, model: str = "flint") -> list[dict]:
        request = urllib.request.Request(f"http://{self.http_url}/v2/models/{model}/generate_stream",
                                         data=json.dumps(body).encode(), method="POST")
        events = []
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: "):
                        events.append(json.loads(line[len("data: "):]))
        except urllib.error.HTTPError:
            raise
        except urllib.error.URLError as e:
            raise self.unreachable(e) from e
        return events

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every series of one metric on /metrics."""
        found = []
        for line in self.metrics().splitlines():
            match = re.match(r"^([^{\s]+)(\{[^}]*\})?\s+(\S+)$", line)
            if match and match.group(1) == name:
                found.append((dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")), float(match.group(3))))
        return found

    def metric(self, name: str, **labels: str) -> float:
        """The value of one series of a flint metric (summed over series matching the labels)."""
        values = [v for series, v in self.series(name) if all(series.get(k) == x for k, x in labels.items())]
        if not values:
            raise KeyError(f"metric {name} {labels} not on /metrics")
        return sum(values)


def grpc_inputs(**values) -> list:
    """Triton inputs in the batch form [1, 1] ([1, n] for lists) that TRT-LLM clients send."""
    import tritonclient.grpc as grpcclient

    types = {"seed": ("UINT64", np.uint64)}
    inputs = []
    for name, value in values.items():
        items = value if isinstance(value, list) else [value]
        if name in types:
            triton_type, dtype = types[name]
        elif isinstance(items[0], bool):
            triton_type, dtype = "BOOL", np.bool_
        elif isinstance(items[0], int):
            triton_type, dtype = "INT32", np.int32
        elif isinstance(items[0], float):
            triton_type, dtype = "FP32", np.float32
        else:
            triton_type, dtype = "BYTES", np.object_
            items = [s.encode() for s in items]
        array = np.array([items], dtype=dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), triton_type)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


class Streams:
    """One gRPC stream carrying many requests; responses are collected per request id."""

    def __init__(self, url: str):
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(url)
        self.results = defaultdict(list)
        self.errors = []
        self.done: dict[str, threading.Event] = {}
        self.client.start_stream(callback=self._callback)

    def _callback(self, result, error):
        if error is not None:
            self.errors.append(error)
            return
        response = result.get_response()
        if response.outputs:
            self.results[response.id].append(result)
        if response.parameters["triton_final_response"].bool_param:
            self.done[response.id].set()

    def send(self, request_id: str, **inputs) -> None:
        self.done[request_id] = threading.Event()
        self.client.async_stream_infer("flint", grpc_inputs(**inputs), request_id=request_id,
                                       enable_empty_final_response=True)

    def wait(self, request_id: str, timeout: float = 120) -> list:
        assert self.done[request_id].wait(timeout), f"{request_id}: no final response; errors {self.errors}"
        return self.results[request_id]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()

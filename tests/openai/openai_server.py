"""`python -m flint_backend.openai` on a free local port, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from flint_backend.serving.launch import PROJECT_ROOT
from triton_server import free_port

START_TIMEOUT = 60


class OpenAIServer:
    def __init__(self, triton_url: str, flags: list[str], log_path: Path, metrics_url: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "flint_backend.openai", "--triton-url", triton_url,
                     "--port", str(self.port), *flags]
        if metrics_url:
            self.argv += ["--triton-metrics-url", metrics_url]
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "OpenAIServer":
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]))
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"the OpenAI server exited ({self.process.returncode}):\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"the OpenAI server did not listen within {START_TIMEOUT}s:\n{self.log()}")

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

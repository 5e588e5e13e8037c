"""Stops tritonserver when an engine's process dies, so that its clients get errors instead of
waiting forever and its supervisor (systemd, Kubernetes, Docker's restart policy) restarts it.

tritonserver 2.51's Python backend does not notice a stub that dies (SIGKILL, the OOM killer,
a segfault in a kernel library): the requests in flight on it never get a response, the model
stays "ready", and every later request fails with "Stub process ... is not healthy". No model
can answer another model's requests, and MODE_NONE allows no reload; what is left is to end the
server, as vLLM's API server ends when its engine core dies.

EngineLease, held by each flint_model instance: a file named for the server's pid and the
stub's, locked with flock while the engine runs. A clean stop (Triton's `finalize`) writes
"stopped" into it and removes it before unlocking; a process that dies loses the lock with
everything else it held, and its file stays.

EngineWatch, a daemon thread in each flint_postprocess instance (every ensemble has one): every
`interval_s` it tries to lock each lease of its server; a lease it can lock that does not say
"stopped" belongs to an engine that died: it logs that, removes the file and sends the server
SIGTERM: tritonserver refuses new requests and waits its --exit-timeout-secs for the requests
in flight (those of other engine instances may finish). The dead engine's requests never do,
and tritonserver 2.51 then hangs in its exit with their connections open; so a detached
`sh` sends SIGKILL KILL_AFTER_S after that timeout if the server is still there, which closes
every connection: each client gets an error.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable

LEASE_DIR = Path(tempfile.gettempdir()) / "flint-engine-leases"
RUNNING, STOPPED = b"running", b"stopped"
TRITON_EXIT_TIMEOUT_S = 30  # tritonserver's default --exit-timeout-secs
KILL_AFTER_S = 5


def lease_path(server_pid: int, stub_pid: int, directory: Path = LEASE_DIR) -> Path:
    return directory / f"{server_pid}-{stub_pid}"


class EngineLease:
    """Held from the end of flint_model's `initialize` to its `finalize`."""

    def __init__(self, server_pid: int | None = None, directory: Path = LEASE_DIR):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = lease_path(server_pid or os.getppid(), os.getpid(), directory)
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.write(self._fd, RUNNING)

    def release(self) -> None:
        """A clean stop: the watchers will not take this engine's exit for a death."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, STOPPED, 0)
        self.path.unlink(missing_ok=True)
        os.close(self._fd)  # releases the lock
        self._fd = None

    def drop(self) -> None:
        """The server is gone: nobody is left to warn, leave nothing behind."""
        self.path.unlink(missing_ok=True)


def exit_timeout_s(server_pid: int) -> int:
    """The server's --exit-timeout-secs, from its command line."""
    try:
        argv = Path(f"/proc/{server_pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return TRITON_EXIT_TIMEOUT_S
    for i, arg in enumerate(argv):
        match = re.fullmatch(r"--exit-timeout-secs(?:=(\d+))?", arg)
        if match:
            value = match.group(1) or (argv[i + 1] if i + 1 < len(argv) else "")
            return int(value) if value.isdigit() else TRITON_EXIT_TIMEOUT_S
    return TRITON_EXIT_TIMEOUT_S


def stop_server(server_pid: int) -> None:
    """SIGTERM now; SIGKILL once its exit timeout (and KILL_AFTER_S) has passed, from a process
    of its own that outlives this one."""
    deadline = exit_timeout_s(server_pid) + KILL_AFTER_S
    subprocess.Popen(["sh", "-c", f"sleep {deadline}; kill -0 {server_pid} 2>/dev/null && kill -9 {server_pid}"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    os.kill(server_pid, signal.SIGTERM)


def dead_engines(server_pid: int, directory: Path = LEASE_DIR) -> list[Path]:
    """Leases of the server whose holder died (unlocked, not stopped); each is removed."""
    dead = []
    for path in sorted(directory.glob(f"{server_pid}-*")):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue  # stopped and removed since the glob
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its engine runs
            if os.pread(fd, len(STOPPED), 0) != STOPPED:
                dead.append(path)
                path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return dead


class EngineWatch:
    def __init__(self, log: Callable[[str], None], server_pid: int | None = None, interval_s: float = 0.5,
                 directory: Path = LEASE_DIR):
        self.server_pid = server_pid or os.getppid()
        self.interval_s, self.directory, self._log = interval_s, directory, log
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flint-engine-watch", daemon=True)

    def start(self) -> "EngineWatch":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()

    def _loop(self) -> None:
        while not self._closed.wait(self.interval_s):
            dead = dead_engines(self.server_pid, self.directory)
            if dead and not self._closed.is_set():
                stubs = ", ".join(p.name.split("-", 1)[1] for p in dead)
                self._log(f"flint_model's engine process (pid {stubs}) died without being stopped; its requests "
                          f"cannot finish and Triton would keep the model ready: stopping tritonserver "
                          f"(pid {self.server_pid}) so that clients get errors and its supervisor restarts it")
                stop_server(self.server_pid)
                return

"""Stops tritonserver when an engine's process dies, so that its clients get errors instead of
waiting forever and its supervisor (systemd, Kubernetes, Docker's restart policy) restarts it.

tritonserver 2.51's Python backend does not notice a stub that dies (SIGKILL, the OOM killer,
a segfault in a kernel library): the requests in flight on it never get a response, the model
stays "ready", and every later request fails with "Stub process ... is not healthy". No model
can answer another model's requests, and MODE_NONE allows no reload; what is left is to end the
server, as vLLM's API server ends when its engine core dies.

EngineLease, held by each flint_model instance: a file named for the server (its pid and start
time) and the stub's pid, locked with flock while the engine runs. A clean stop (Triton's
`finalize`) writes "stopped" into it and removes it before unlocking; a process that dies loses
the lock with everything else it held, and its file stays. The start time keeps such a file from
being read as a later server's when the pid comes round again (a restarted container's server
often has the same pid); a new lease removes the unlocked files of servers that are gone.

EngineWatch, a daemon thread in each flint_postprocess instance (every ensemble has one): every
`interval_s` it tries to lock each lease of its server; a lease it can lock that still says
"running" belongs to an engine that died: it logs that, removes the file and sends the server
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


def process_start(pid: int) -> str | None:
    """When the process started (clock ticks since boot, /proc/PID/stat's 22nd field): with the
    pid, it names one process; None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields from the 3rd on follow the command's ")"


def server_key(pid: int) -> str:
    """"PID.START" of a running server."""
    return f"{pid}.{process_start(pid)}"


def lease_path(server: str, stub_pid: int, directory: Path = LEASE_DIR) -> Path:
    return directory / f"{server}-{stub_pid}"


class EngineLease:
    """Held from the end of flint_model's `initialize` to its `finalize`."""

    def __init__(self, server: str | None = None, directory: Path = LEASE_DIR):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        remove_stale_leases(directory)
        self.path = lease_path(server or server_key(os.getppid()), os.getpid(), directory)
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


def _remove_if_unheld(path: Path, content: bytes | None) -> bool:
    """Removes a lease nobody holds that reads `content` (None: whatever it reads); True when it
    was removed."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False  # stopped and removed since it was listed
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its engine runs
        if content is not None and os.pread(fd, len(content) + 1, 0) != content:
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)


def dead_engines(server: str, directory: Path = LEASE_DIR) -> list[Path]:
    """Leases of the server ("PID.START") whose holder died: unlocked, reading "running" (not
    "stopped", and not empty: a lease between its creation and its lock); each is removed."""
    return [path for path in sorted(directory.glob(f"{server}-*")) if _remove_if_unheld(path, RUNNING)]


def remove_stale_leases(directory: Path = LEASE_DIR) -> None:
    """Removes the unheld leases of servers that are gone (their pid not running, or running a
    later process), which no watcher is left to find."""
    for path in directory.iterdir():
        pid, _, start = path.name.rsplit("-", 1)[0].partition(".")
        if not (pid.isdigit() and start and process_start(int(pid)) == start):
            _remove_if_unheld(path, None)


class EngineWatch:
    def __init__(self, log: Callable[[str], None], server_pid: int | None = None, interval_s: float = 0.5,
                 directory: Path = LEASE_DIR):
        self.server_pid = server_pid or os.getppid()
        self.server = server_key(self.server_pid)
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
            dead = dead_engines(self.server, self.directory)
            if dead and not self._closed.is_set():
                stubs = ", ".join(p.name.rsplit("-", 1)[1] for p in dead)
                self._log(f"flint_model's engine process (pid {stubs}) died without being stopped; its requests "
                          f"cannot finish and Triton would keep the model ready: stopping tritonserver "
                          f"(pid {self.server_pid}) so that clients get errors and its supervisor restarts it")
                stop_server(self.server_pid)
                return

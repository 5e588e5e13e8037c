"""Ends the engine's process with its tritonserver, and on SIGTERM.

The Python backend runs each model instance in a stub process, a child of tritonserver, that
ignores SIGINT and SIGTERM (tritonserver stops it through `finalize`). When tritonserver dies
without that (SIGKILL, a crash, its exit timeout), the stub's own check of its parent
deadlocks on the message queues to the dead server (tritonserver 2.51), and the engine runs
on: it finishes the requests in flight for nobody, then idles holding its memory.

ParentWatch, a daemon thread started in `initialize`, stops the process instead: when this
process's parent changes (the server is gone: we were re-parented) or on SIGTERM, it runs
`stop` (abort every request, stop the engine) for at most `grace_s`, removes the stub's
shared-memory region and runs `on_orphaned` when the server is gone (nobody else will clean
up), and leaves with `os._exit`
(the stub's threads blocked on the dead server would hold up a normal exit).

SIGTERM: the stub runs `initialize` on its main thread, where Python may install a handler;
but that thread waits in C++ for the server's next command, so a Python-level handler would
run only then. The handler's C part writes to the wakeup fd, which this thread reads.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

STUB = "triton_python_backend_stub"
SHM_DIR = Path("/dev/shm")


def stub_shm_region(cmdline: Path = Path("/proc/self/cmdline")) -> Path | None:
    """The shared-memory file of this stub process (its argv: stub, model.py, region, ...)."""
    try:
        argv = cmdline.read_bytes().split(b"\0")
    except OSError:
        return None
    if len(argv) < 3 or not argv[0].decode(errors="replace").endswith(STUB):
        return None
    return SHM_DIR / argv[2].decode(errors="replace").lstrip("/")


def _stderr(message: str) -> None:
    # not pb_utils.Logger: its messages travel to the server, which may be gone
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class ParentWatch:
    def __init__(self, stop: Callable[[], None], name: str = "flint_model", interval_s: float = 0.5,
                 grace_s: float = 5.0, log: Callable[[str], None] = _stderr,
                 on_orphaned: Callable[[], None] = lambda: None):
        self.parent = os.getppid()
        self.name, self._stop, self._log, self._on_orphaned = name, stop, log, on_orphaned
        self.interval_s, self.grace_s = interval_s, grace_s
        self.catches_sigterm = False
        self._wakeup: int | None = None  # read end of the SIGTERM wakeup pipe
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="flint-parent-watch", daemon=True)

    def start(self) -> "ParentWatch":
        self.catches_sigterm = self._catch_sigterm()
        self._thread.start()
        return self

    def close(self) -> None:
        """The server finalizes us: stop watching (a SIGTERM now finds the default: ignored)."""
        self._closed.set()

    def _catch_sigterm(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False  # Python sets handlers on the main thread only; the parent check still runs
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.set_wakeup_fd(write)
        self._wakeup = read
        return True

    def _loop(self) -> None:
        while not self._closed.is_set():
            if self._wakeup is None:
                self._closed.wait(self.interval_s)
            elif select.select([self._wakeup], [], [], self.interval_s)[0]:
                if signal.SIGTERM in os.read(self._wakeup, 64) and not self._closed.is_set():
                    return self._exit("SIGTERM", 128 + signal.SIGTERM)
            if os.getppid() != self.parent and not self._closed.is_set():
                return self._exit(f"tritonserver (pid {self.parent}) is gone", 1)

    def _exit(self, why: str, code: int) -> None:
        orphaned = os.getppid() != self.parent
        self._log(f"{self.name} (pid {os.getpid()}): {why}: aborting every request and exiting")
        stopping = threading.Thread(target=self._stop, name="flint-stop", daemon=True)
        stopping.start()
        stopping.join(self.grace_s)
        region = stub_shm_region() if orphaned else None  # a live server removes it itself
        if region is not None:
            region.unlink(missing_ok=True)
        if orphaned:
            self._on_orphaned()
        os._exit(code)

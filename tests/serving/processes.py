"""The processes of a server under test, read from /proc: a session's, a process tree's, the
Python backend stubs among them, their resident memory."""

from __future__ import annotations

import re
from pathlib import Path


def _stat(pid: int) -> tuple[str, int, int]:
    """(state, parent pid, session id) of a process; raises OSError when it is gone."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...
    return fields[0], int(fields[1]), int(fields[3])


def _live() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every live (not zombie) process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, parent, session = _stat(int(entry.name))
            except (OSError, ValueError):
                continue
            if state != "Z":
                found[int(entry.name)] = (parent, session)
    return found


def argv(pid: int) -> list[str]:
    """A live process's command line ([] when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def session_processes(session: int) -> dict[int, str]:
    """pid -> command line of the live processes of a session."""
    return {pid: " ".join(argv(pid)) for pid, (_, s) in _live().items() if s == session}


def process_tree(root: int) -> list[int]:
    """The pid and every live descendant's (the Python backend stubs are tritonserver's children)."""
    parents = {pid: parent for pid, (parent, _) in _live().items()}
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def stub_processes(server_pid: int, model: str) -> dict[int, list[str]]:
    """pid -> argv of the Python backend stubs of `model`'s instances among the server's
    descendants (other tritonservers on this machine run stubs of the same name)."""
    found = {}
    for pid in process_tree(server_pid)[1:]:
        args = argv(pid)
        if args and args[0].endswith("triton_python_backend_stub") and any(f"/{model}/" in a for a in args):
            found[pid] = args
    return found


def resident_bytes(root: int) -> int:
    """Sum of VmRSS over the process tree (shared pages, e.g. the stubs' /dev/shm regions, count
    in each process that touched them)."""
    total = 0
    for pid in process_tree(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(match.group(1)) * 1024 if match else 0
    return total

"""One process per weight format for the GPU benchmark scripts (bench.py, bench_step_timeline.py,
bench_step_gaps.py): each format's engine starts from a fresh allocator (bench.py's docstring says
what a second engine in the same process cost), and the parent merges what the children wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def without_flags(argv: list[str], flags: tuple[str, ...] = ("--formats", "--out")) -> list[str]:
    """argv without the given flags and their values (`--flag value` and `--flag=value`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in flags)):
            out.append(arg)
    return out


def run_in_child(command: list[str], fmt: str, *extra: str) -> dict:
    """Runs `command` (the interpreter's arguments: a script or -m module) with this process's
    arguments but --formats fmt and a temporary --out (and `extra`) -> the child's formats[0]. The
    child finds the tools package from any working directory."""
    out = Path(tempfile.mkdtemp()) / f"{fmt}.json"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    subprocess.run([sys.executable, *command, *without_flags(sys.argv[1:]), "--formats", fmt, "--out", str(out),
                    *extra], check=True, env={**os.environ, "PYTHONPATH": path})
    return json.loads(out.read_text())["formats"][0]


def each_format(formats: str, one_format: bool, run_here, module: str) -> list[dict]:
    """--formats "a,b" -> [run_here(a), run_here(b)], each in a child `python -m module` (with
    --one-format, which the children get) unless there is one format or this is a child."""
    names = formats.split(",")
    if one_format or len(names) == 1:
        return [run_here(fmt) for fmt in names]
    return [run_in_child(["-m", module], fmt, "--one-format") for fmt in names]

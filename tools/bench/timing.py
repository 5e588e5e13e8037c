"""What the benchmark scripts time with and how they label a run, written once: a device-to-device
copy's bandwidth (the floor a memory-bound time is a fraction of), one call's time in a replayed
CUDA graph (L2-cold calls: `cycled`), the bytes a call reads, and the run's metadata (GPU, commit,
date, command), which also names its JSON as benchmarks/ keeps results:
benchmarks/<gpu>/<date>-<commit>-<what>.json."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
GRAPH_REPS = 20  # calls of fn one graph holds: launch overhead as a decode step's graph pays it


def copy_bandwidth(device="cuda", elements: int = 1 << 30) -> float:
    """Bytes read + written per second by a copy of `elements` bf16 values (2 GiB by default) on
    `device`: the median of 6 copies after 2. On a GPU each copy is timed alone by CUDA events (a
    graph of several would measure the copy engine's queue); elsewhere by the host clock."""
    cuda = torch.device(device).type == "cuda"
    src = torch.empty(elements, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    times = []  # s
    for _ in range(8):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times[2:])


def graph_us(fn, reps: int = GRAPH_REPS) -> float:
    """Median us per call of fn() captured `reps` times in one CUDA graph (5 replays after one):
    the launch cost a graph pays, not Python's. fn runs once before the capture (compiles)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times[1:])


def cycled(fns):
    """One callable that calls fns[0], fns[1], ... in turn: captured GRAPH_REPS times in a graph, each
    call reads other weights, so no call finds its weights in L2 (50 MB) from the call before."""
    state = {"i": 0}

    def call():
        state["i"] += 1
        return fns[(state["i"] - 1) % len(fns)]()
    return call


def nbytes(*weights) -> int:
    """Bytes of tensors and NVFP4 weights (packed codes + block scales + global scale: their nbytes())."""
    return sum(w.nbytes() if callable(getattr(w, "nbytes", None)) else w.numel() * w.element_size()
               for w in weights)


def gpu_name(device="cuda") -> str:
    return torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda" else "cpu"


def commit() -> str:
    """The tree's short commit: GIT_COMMIT where the tree has no .git (the device machine), else git's."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:  # no git
        return "unknown"
    return head.stdout.strip() or "unknown"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="minutes")


def command(script: str, argv: list[str] | None = None) -> str:
    """How `script` (a __file__) ran: "python tools/bench/NAME.py ARGS", ARGS this process's
    arguments unless given."""
    path = Path(script).resolve()
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return " ".join(["python", str(name), *(sys.argv[1:] if argv is None else argv)])


def run_meta(script: str, copy_tb_s: float, device="cuda") -> dict:
    """The meta of a benchmark JSON: GPU, commit, date, the command, the measured copy bandwidth, torch."""
    return {"gpu": gpu_name(device), "commit": commit(), "date": utc_now(), "command": command(script),
            "copy_tb_s": round(copy_tb_s, 3), "torch": torch.__version__}


def result_path(what: str, device="cuda") -> Path:
    """benchmarks/<gpu>/<date>-<commit>-<what>.json (gpu: h100, h200, ... or cpu), from the working
    directory: a script's --out when none is given."""
    gpu = gpu_name(device).removeprefix("NVIDIA ").split()[0].lower()
    return Path("benchmarks") / gpu / f"{datetime.now(timezone.utc):%Y-%m-%d}-{commit()}-{what}.json"

"""Where a running tritonserver spends its host time, read from outside it: the CPU seconds of
tritonserver and of each Python backend stub (Linux /proc: the server's process tree, a stub
named by the model whose model.py it runs), and Triton's statistics of each model (per
execution: the time its requests queued and the time the model took). Taken before and after a
run, their differences over the run's output tokens say what each stage costs a token.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

MODELS = ("flint", "flint_tokenizer", "flint_model", "flint_postprocess")
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a live process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _role(pid: int) -> str:
    """'tritonserver', a stub's model name (its argv names .../<model>/<version>/model.py), else 'other'."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "other"
    for arg in argv:
        match = re.search(rb"([^/]+)/\d+/model\.py$", arg)
        if match:
            return match.group(1).decode()
    return "tritonserver" if argv and argv[0].endswith(b"tritonserver") else "other"


def process_cpu(root: int) -> dict[str, float]:
    """CPU seconds so far of `root` and its descendants, summed by role (tritonserver, each model)."""
    parents: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents[int(entry.name)], seconds[int(entry.name)] = stat
    tree, grew = {root}, True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        grew = bool(found)
    totals: dict[str, float] = {}
    for pid in tree & set(seconds):
        role = _role(pid)
        totals[role] = totals.get(role, 0.0) + seconds[pid]
    return totals


def model_stats(url: str, models: tuple[str, ...] = MODELS) -> dict[str, dict]:
    """Triton's statistics extension per model: executions, requests, and the ns of each phase."""
    stats = {}
    for model in models:
        with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=10) as response:
            entry = json.loads(response.read())["model_stats"][0]
        phases = entry["inference_stats"]
        stats[model] = {"executions": int(entry.get("execution_count", 0)),
                        "requests": int(phases["success"]["count"]) + int(phases["fail"]["count"]),
                        **{f"{phase}_ns": int(phases[phase]["ns"])
                           for phase in ("queue", "compute_input", "compute_infer", "compute_output")}}
    return stats


def difference(after: dict, before: dict) -> dict:
    """after - before, key by key (nested dicts alike)."""
    return {k: difference(v, before.get(k, {})) if isinstance(v, dict) else v - before.get(k, 0)
            for k, v in after.items()}


def per_token(cpu_seconds: dict[str, float], model_ns: dict[str, dict], tokens: int) -> dict:
    """A run's host costs over its output tokens: CPU ms a token by process, and per model the
    us of an execution spent queued and computing (requests a token says how often it runs)."""
    models = {}
    for model, s in model_ns.items():
        executions = max(1, s["executions"])
        models[model] = {"requests_per_token": round(s["requests"] / tokens, 3),
                         "queue_us_per_execution": round(s["queue_ns"] / executions / 1e3, 1),
                         "compute_us_per_execution": round((s["compute_input_ns"] + s["compute_infer_ns"]
                                                            + s["compute_output_ns"]) / executions / 1e3, 1)}
    return {"cpu_ms_per_token": {role: round(s / tokens * 1e3, 4) for role, s in sorted(cpu_seconds.items())},
            "models": models}

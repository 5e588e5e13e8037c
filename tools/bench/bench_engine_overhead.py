#!/usr/bin/env python3
"""Scheduler + Python overhead per decode step, by batch size: what the GPU path must hide.

    python tools/bench/bench_engine_overhead.py [--batch-sizes 1,2,4,8,16,32,64] [--out FILE]

Runs the flint-tiny engine on the CPU with every sequence decoding, and splits each step into
schedule, step-batch build (host lists -> tensors), model forward, sampling and bookkeeping.
Overhead = step time - forward time. Prints a markdown table and writes JSON (--out; by default
benchmarks/cpu/<date>-<commit>-engine-overhead.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a file

from flint_backend.engine import runner as runner_module  # noqa: E402
from flint_backend.engine.engine import LLMEngine  # noqa: E402
from flint_backend.engine.engine_args import EngineArgs  # noqa: E402
from flint_backend.engine.sampling_params import SamplingParams  # noqa: E402
from tools.bench.timing import command, commit, result_path  # noqa: E402


class Timers:
    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.samples.setdefault(name, []).append(time.perf_counter() - start)
        return timed


def measure(batch: int, steps: int) -> dict:
    # eager steps (host lists -> tensors each step), so every phase is timed separately; the GPU's
    # graph path replaces build_batch with DecodeGraphs._fill over static buffers
    engine = LLMEngine(EngineArgs(dtype="float32", device="cpu", max_num_seqs=max(batch, 1), enforce_eager=True,
                                  max_num_batched_tokens=max(2048, batch), block_size=16, max_model_len=2048))
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=0, max_tokens=steps + 50, ignore_eos=True)
    for i in range(batch):
        engine.add_request([1 + (i * 7 + j) % 8000 for j in range(32)], params)
    while any(not s.is_decoding for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()  # finish the prefills
    timers = Timers()
    engine.scheduler.schedule = timers.wrap("schedule", engine.scheduler.schedule)
    runner_module.build_step_batch = timers.wrap("build_batch", runner_module.build_step_batch)
    engine.runner.model.forward = timers.wrap("forward", engine.runner.model.forward)
    engine.runner.sampler = timers.wrap("sample", engine.runner.sampler)
    step = timers.wrap("step", engine.step)
    for _ in range(steps):
        step()
    med = {name: statistics.median(values) * 1e3 for name, values in timers.samples.items()}
    med["overhead"] = statistics.median(
        (s - f) * 1e3 for s, f in zip(timers.samples["step"], timers.samples["forward"]))
    med["bookkeeping"] = med["overhead"] - med["schedule"] - med["build_batch"] - med["sample"]
    return {"batch": batch, **{k: round(v, 4) for k, v in med.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, help="default: benchmarks/cpu/<date>-<commit>-engine-overhead.json")
    args = parser.parse_args()
    args.out = args.out or result_path("engine-overhead", "cpu")
    torch.set_num_threads(1)
    rows = [measure(int(b), args.steps) for b in args.batch_sizes.split(",")]
    meta = {"date": date.today().isoformat(), "machine": f"{platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} torch thread", "commit": commit(),
            "command": command(__file__), "unit": "ms per decode step (median)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    cols = ["batch", "overhead", "schedule", "build_batch", "sample", "bookkeeping", "forward", "step"]
    print(f"\n{meta['command']}  ({meta['date']}, {meta['machine']}, commit {meta['commit']}; ms per step, median)\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
